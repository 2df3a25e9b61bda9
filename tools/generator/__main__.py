import sys

from tools.generator.events import main

sys.exit(main())
