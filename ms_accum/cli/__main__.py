"""``python -m ms_accum.cli``: the ``ms-accum`` command."""
import sys

from . import main

sys.exit(main())
