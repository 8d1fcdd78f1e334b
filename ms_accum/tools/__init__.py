"""Tools for your own model: verify the window against the large batch, plan B, K and the structure."""
from .._exports import lazy

_EXPORTS = {
    "verify_equivalence": ".verify", "EquivalenceReport": ".verify", "explain": ".causes", "Cause": ".causes",
    "plan": ".planner", "measure": ".planner", "parse_size": ".planner", "process_status": ".planner",
    "PeakMemory": ".planner",
    "replace_batchnorm": ".norm",
    "load_model": ".factory", "UserModel": ".factory",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy(__name__, _EXPORTS)
