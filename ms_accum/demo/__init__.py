"""The MNIST application the CLI and the tutorials run: data, the demo networks, evaluation."""
from .._exports import lazy

_EXPORTS = {
    "LeNet5": ".models", "MLP": ".models", "CharTransformer": ".models", "ConvNet": ".models",
    "build_model": ".models", "make_optimizer": ".models",
    "create_dataset": ".data", "datapipe": ".data", "read_idx": ".data", "write_idx": ".data",
    "DataError": ".data", "resolve_data_dir": ".data", "check_mnist_dir": ".data", "download_mnist": ".data",
    "make_synthetic_mnist": ".data",
    "EvalResult": ".evaluation", "evaluate": ".evaluation", "evaluate_checkpoint": ".evaluation",
    "recorded_data_dir": ".evaluation",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy(__name__, _EXPORTS)
