"""Entry points of the runtime's own processes (never imported by a kernel).

``python -m tfos_nb.runtime supervisor``: a node's supervisor (started by the launch task).
``python -m tfos_nb.runtime node``: a node's TensorFlow process (started by its supervisor).
``python -m tfos_nb.runtime run``: one parallel run's process (started by its Spark task).
``python -m tfos_nb.runtime coordinator``: a cluster's control server on an executor (Spark Connect).
"""

import sys

if __name__ == "__main__":
    role = sys.argv[1] if len(sys.argv) > 1 else ""
    if role == "supervisor":
        from tfos_nb.runtime.executor.process.supervisor import main
    elif role == "node":
        from tfos_nb.runtime.executor.process.node import main
    elif role == "run":
        from tfos_nb.runtime.executor.process.run_task import main
    elif role == "coordinator":
        from tfos_nb.runtime.driver.connect.coordinator import main
    else:
        sys.stderr.write("usage: python -m tfos_nb.runtime supervisor|node|run|coordinator\n")
        sys.exit(2)
    sys.exit(main())
