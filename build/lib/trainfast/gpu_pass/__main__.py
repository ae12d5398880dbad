"""``python -m trainfast.gpu_pass``: see :mod:`trainfast.gpu_pass`."""

from trainfast.gpu_pass.run import main

if __name__ == "__main__":  # importing every module (the listing tests do) runs nothing
    raise SystemExit(main())
