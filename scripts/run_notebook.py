"""Execute a notebook headless in a real IPython kernel of this interpreter (nbclient).

Writes the executed copy to build/<name>.ipynb, prints its path and the
notebook's ``accuracy: …`` lines; exits non-zero if a cell failed.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path

import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError


def main(path: str) -> int:
    src = Path(path).resolve()
    out_dir = src.parent.parent / "build"
    out_dir.mkdir(exist_ok=True)
    out = out_dir / src.name
    nb = nbformat.read(src, as_version=4)
    with tempfile.TemporaryDirectory() as kernels:
        spec = Path(kernels) / "tfos-nb"
        spec.mkdir()
        (spec / "kernel.json").write_text(
            json.dumps(
                {
                    "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                    "display_name": "tfos_nb",
                    "language": "python",
                }
            )
        )
        km = KernelManager(kernel_name="tfos-nb", kernel_spec_manager=KernelSpecManager(kernel_dirs=[kernels]))
        client = NotebookClient(nb, km=km, timeout=1200, resources={"metadata": {"path": str(src.parent)}})
        failed = None
        try:
            client.execute()
        except CellExecutionError as exc:
            failed = exc
        finally:
            nbformat.write(nb, out)
            if client.kc is not None:  # given km, nbclient leaves its channels open: they would reconnect forever
                client.kc.stop_channels()
            if km.has_kernel:  # km is ours, not the client's: stop the kernel (and its Spark) ourselves
                km.shutdown_kernel()
    print(f"executed notebook: {out}")
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            if o.get("output_type") == "stream":
                for line in re.findall(r"^accuracy: .*$", o.get("text", ""), flags=re.M):
                    print(line)
    if failed is not None:
        print(f"a cell failed:\n{failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "notebooks/quickstart.ipynb"))
