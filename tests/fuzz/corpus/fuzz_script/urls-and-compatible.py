pkg @ https://example.invalid/pkg-1.0.tar.gz
foo_bar.Baz~=1.4.2

import os
