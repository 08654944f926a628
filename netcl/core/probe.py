"""The child process of a variant probe (netcl.core.variants.run_probe): `python -m netcl.core.probe REQUEST`
finds the parent's device by its fingerprint, runs the named probe function on it and says `probe ok`.
A compiler that crashes here ends only this process."""

from __future__ import annotations

import importlib
import json
import sys

from netcl.core.device import manager
from netcl.core.variants import fingerprint


def main(argv: list[str]) -> int:
    request = json.loads(argv[0])
    device = next((h for h in manager.devices() if fingerprint(h) == request["fingerprint"]), None)
    if device is None:
        print(
            f"error: no device with fingerprint {request['fingerprint']!r} in the probe process",
            file=sys.stderr,
        )
        return 2
    module_name, func_name = request["function"].split(":")
    # the probe function is named by the parent (a string, so it can be any module's): imported by name
    getattr(importlib.import_module(module_name), func_name)(device, *request["args"])
    print("probe ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
