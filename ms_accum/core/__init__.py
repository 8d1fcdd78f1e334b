"""The window: the buffer and its rules, the guard, graph math, in-graph statistics, reducers, losses, dropout
streams."""
from .._exports import lazy

_EXPORTS = {
    "AccumulationBuffer": ".buffer", "Reduction": ".buffer",
    "TokenCrossEntropy": ".losses", "LossOnly": ".losses",
    "WithLossColumns": ".columns",
    "DropoutStreams": ".dropout", "dropout_streams": ".dropout", "SeededDropout": ".dropout",
    "KernelBuildError": ".native",
    "NoiseScale": ".statistics",
    "DataParallelInfo": ".parallel", "data_parallel_info": ".parallel",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy(__name__, _EXPORTS)
