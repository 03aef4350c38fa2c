"""The project's one hierarchy of user-facing errors.

Every message says what was received, what was expected, and how to fix it. The CLIs
print the message and exit non-zero, without a traceback.
"""


class ToolError(Exception):
    """Base of every error a user can cause and fix."""

    exit_code = 2


class SpecError(ToolError):
    """A model spec is invalid."""


class ConfigError(ToolError):
    """A Triton model configuration is invalid."""


class ExportError(ToolError):
    """Exporting a model to ONNX failed."""


class ValidationError(ToolError):
    """Numerical validation of an exported model failed."""


class ServerError(ToolError):
    """The Triton server could not be started, reached or stopped."""


class ClientError(ToolError):
    """A client request could not be built or was refused."""


class MeasurementError(ToolError):
    """A measurement (perf_analyzer, Locust) could not run or gave no result."""


class RecordingError(ToolError):
    """A traffic recording could not be written or read."""
