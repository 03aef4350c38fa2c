"""Where the project's own files are: the checkout (or install prefix) above the package, and its .tools folder
(compiled shims and modules, perf_analyzer, Prometheus; 0700)."""

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
CHECKOUT = PACKAGE.parent  # the repository, or site-packages for an installed wheel
TOOLS = CHECKOUT / ".tools"
