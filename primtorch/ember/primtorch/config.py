"""ember.primtorch's configuration, readable in one place."""

import dataclasses
import os


@dataclasses.dataclass
class PrimtorchConfig:
    """Options of ember.primtorch; each environment variable is a documented override."""

    # Check every recorded prim's meta against its real output, and every decomposition's result
    # against eager (dtype, sizes, values). EMBER_PRIMTORCH_CHECK=1 turns it on.
    check: bool = os.environ.get("EMBER_PRIMTORCH_CHECK", "0") == "1"


config = PrimtorchConfig()
