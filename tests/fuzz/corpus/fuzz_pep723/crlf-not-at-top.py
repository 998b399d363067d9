#!/usr/bin/env python3
"""Doc."""
# /// script
# dependencies = ["numpy>=2"]
# ///
import numpy
