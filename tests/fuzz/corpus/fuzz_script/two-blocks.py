# /// script
# dependencies = ["a", "a"]
# ///
# /// script
# ///
