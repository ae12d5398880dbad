"""``python -m trainfast.gpu_pass``: see :mod:`trainfast.gpu_pass`."""

from trainfast.gpu_pass.run import main

raise SystemExit(main())
