"""ember.primtorch's configuration, readable in one place."""

import dataclasses
import os


@dataclasses.dataclass
class PrimtorchConfig:
    """Options of ember.primtorch; each environment variable is a documented override."""

    # Check every recorded prim's meta against its real output, and every decomposition's result
    # against eager (dtype, sizes, values). EMBER_PRIMTORCH_CHECK=1 turns it on.
    check: bool = os.environ.get("EMBER_PRIMTORCH_CHECK", "0") == "1"

    # While tracing CUDA inference, run scaled_dot_product_attention on cuDNN's fused kernel
    # (extern.sdpa_cudnn) wherever torch itself would (see attention.py); off, such calls take the
    # flash or memory-efficient kernel as before. EMBER_CUDNN_ATTENTION=0 turns it off.
    cudnn_attention: bool = os.environ.get("EMBER_CUDNN_ATTENTION", "1") != "0"


config = PrimtorchConfig()
