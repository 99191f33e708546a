import sys

from nibble.trainer.main import main

sys.exit(main())
