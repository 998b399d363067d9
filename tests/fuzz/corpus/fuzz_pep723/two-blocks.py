# /// script
# dependencies = ["a"]
# ///

# /// script
# dependencies = ["b"]
# ///
