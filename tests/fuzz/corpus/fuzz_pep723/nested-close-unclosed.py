# /// script
# text = """
# ///
# """
# ///
#x
# /// script
