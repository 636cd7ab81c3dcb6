"""ember.aot_autograd: joint forward+backward graphs, functionalisation, partitioning."""

from ember.ir import component_version, require

require("aot_autograd", reads=(1,), writes=1)
__version__ = component_version("aot_autograd", __file__)

from .api import (  # noqa: E402
    BACKENDS,
    AOTFunction,
    AOTModule,
    RuntimeCache,
    aot_eager,
    aot_function,
    aot_module,
    aot_module_simplified,
    run_as_fx,
)
from .export import export_inference_graph  # noqa: E402
from .module_call import GUARDED_INPUTS_META, GuardViolation  # noqa: E402
from .partition import default_partition, min_cut_partition, saved_bytes  # noqa: E402
from .plan_codec import NotSerializable, plan_from_json, plan_to_json  # noqa: E402

__all__ = [
    "AOTFunction", "AOTModule", "BACKENDS", "GUARDED_INPUTS_META", "GuardViolation",
    "NotSerializable", "RuntimeCache", "aot_eager", "aot_function", "aot_module",
    "aot_module_simplified", "default_partition", "export_inference_graph", "min_cut_partition",
    "plan_from_json", "plan_to_json", "run_as_fx", "saved_bytes",
]  # fmt: skip
