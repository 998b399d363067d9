# /// pyproject
# [project]
# name = "x"
# ///

# /// script
# ///
print(1)
