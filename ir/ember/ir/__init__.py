"""ember.ir: the frozen IR schema shared by every Ember component."""

from . import control_flow  # noqa: F401  (defines control.cond, control.while_loop, control.map)
from .artifact import BufferIR, CompiledArtifact, KernelIR, StepIR, new_artifact
from .codec import dumps, from_json, loads, to_json
from .graph import GraphIR, NodeIR, SubgraphIR, graph_from_ir, graph_to_ir
from .meta import (FULLGRAPH_META_KEY, GUARDED_INPUTS_META_KEY, INPUT_UPDATES_META_KEY,
                   NODE_META_KEY, RECOMPUTE_META_KEY, WRITTEN_AFTER_CALL_META_KEY, TensorMeta,
                   contiguous_strides, dtype_from_name, dtype_name, meta_of)
from .ops import ArgSpec, OpSchema, define, lookup, resolve, target_name, vocabulary
from .schema import check_golden, current_schema
from .symbols import CeilDiv, FloorDiv, ModularIndexing, SymbolSpec, as_expr, sym
from .version import IR_VERSION, READABLE_VERSIONS, IRVersionError, component_version, require

__version__ = component_version("ir", __file__)

__all__ = [
    "ArgSpec", "BufferIR", "CeilDiv", "CompiledArtifact", "FloorDiv", "GraphIR", "IRVersionError",
    "FULLGRAPH_META_KEY", "GUARDED_INPUTS_META_KEY", "INPUT_UPDATES_META_KEY",
    "IR_VERSION", "KernelIR", "ModularIndexing", "NODE_META_KEY", "NodeIR", "OpSchema",
    "READABLE_VERSIONS", "RECOMPUTE_META_KEY", "StepIR", "SubgraphIR", "SymbolSpec", "TensorMeta", "as_expr",
    "check_golden",
    "component_version", "contiguous_strides", "current_schema", "define", "dtype_from_name", "dtype_name", "dumps",
    "from_json", "graph_from_ir", "graph_to_ir", "loads", "lookup", "meta_of", "new_artifact",
    "require", "resolve", "sym", "target_name", "to_json", "vocabulary",
    "WRITTEN_AFTER_CALL_META_KEY",
]  # fmt: skip
