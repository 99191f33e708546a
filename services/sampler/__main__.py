import sys

from nibble.sampler.main import main

sys.exit(main())
