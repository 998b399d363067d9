numpy>=1.26
rich[jupyter]==13.7.1 ; python_version >= "3.9"

# /// script
# dependencies = ["Rich", "numpy<2"]
# [tool.uv]
# exclude-newer = "2024-01-01T00:00:00Z"
# ///
print("x")
