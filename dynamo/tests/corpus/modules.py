"""nn.Module programs: built-in layers, containers, submodules, parameters and buffers."""

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import module_case


def x34():
    return (torch.randn(3, 4),)


def img():
    return (torch.randn(2, 3, 8, 8),)


@module_case(x34)
class LinearOnly(nn.Linear):
    def __init__(self):
        super().__init__(4, 5)


@module_case(x34)
class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


@module_case(x34)
class SequentialStack(nn.Sequential):
    def __init__(self):
        super().__init__(nn.Linear(4, 6), nn.GELU(), nn.Linear(6, 4), nn.Tanh())


@module_case(x34)
class ModuleListLoop(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x) + i
        return x


@module_case(x34)
class ModuleListIndex(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

    def forward(self, x):
        return self.layers[0](x) + self.layers[-1](x) + len(self.layers)


@module_case(x34)
class ModuleDictHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleDict({"a": nn.Linear(4, 2), "b": nn.Linear(4, 3)})

    def forward(self, x):
        outs = {k: head(x) for k, head in self.heads.items()}
        return outs["a"].sum() + outs["b"].sum() + self.heads["a"](x)


@module_case(x34)
class ParameterDirect(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))
        self.register_buffer("b", torch.ones(4))

    def forward(self, x):
        return x @ self.w + self.b


@module_case(x34)
class ParameterListUse(nn.Module):
    def __init__(self):
        super().__init__()
        self.ps = nn.ParameterList([nn.Parameter(torch.randn(4)) for _ in range(3)])

    def forward(self, x):
        for p in self.ps:
            x = x * p
        return x + self.ps[1]


@module_case(x34)
class TiedWeights(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4, bias=False)
        self.b = nn.Linear(4, 4, bias=False)
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.b(self.a(x))


@module_case(img)
class ConvBnRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


@module_case(img)
class ConvBnEval(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.eval()

    def forward(self, x):
        return self.bn(self.conv(x)).mean()


@module_case(img)
class PoolingFlatten(nn.Module):
    def __init__(self):
        super().__init__()
        self.pool = nn.MaxPool2d(2)
        self.gap = nn.AdaptiveAvgPool2d((1, 1))
        self.flat = nn.Flatten()

    def forward(self, x):
        return self.flat(self.gap(self.pool(x)))


@module_case(lambda: (torch.randint(0, 10, (2, 5)),))
class EmbeddingLayerNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.ln = nn.LayerNorm(8)

    def forward(self, ids):
        return self.ln(self.emb(ids))


@module_case(x34)
class DropoutEval(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.3)
        self.eval()

    def forward(self, x):
        return self.drop(x) * 2


@module_case(x34)
class TrainingFlagBranch(nn.Module):
    def forward(self, x):
        if self.training:
            return x * 2
        return x


@module_case(x34)
class AttributeConstants(nn.Module):
    def __init__(self):
        super().__init__()
        self.eps = 1e-3
        self.scale = 2
        self.mode = "sum"
        self.dims = (0, 1)

    def forward(self, x):
        y = x * self.scale + self.eps
        return y.sum(self.dims) if self.mode == "sum" else y


@module_case(x34)
class HelperMethod(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def _block(self, x, k):
        return self.lin(x) * k

    def forward(self, x):
        return self._block(x, 2) + self._block(x, 3)


class BaseBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x)


@module_case(x34)
class SuperForward(BaseBlock):
    def forward(self, x):
        return super().forward(x) * 2


@module_case(x34)
class PropertyOnModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    @property
    def weight_t(self):
        return self.lin.weight.t()

    def forward(self, x):
        return x @ self.weight_t


@module_case(x34)
class NestedSubmodules(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), nn.Linear(4, 2))

    def forward(self, x):
        return self.block(x)


@module_case(lambda: (torch.randn(2, 5, 8),))
class MultiheadAttn(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.eval()

    def forward(self, x):
        out, _ = self.attn(x, x, x, need_weights=False)
        return out


# Its fast-path check walks self.modules() (generators and `yield from`, run to completion).
@module_case(lambda: (torch.randn(2, 5, 8),))
class TransformerLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        self.eval()

    def forward(self, x):
        return self.layer(x)


@module_case(lambda: (torch.randn(3, 4), torch.randn(3, 4)))
class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, y=None):
        out = self.lin(x)
        if y is not None:
            out = out + y
        return out


@module_case(lambda: (torch.randn(3, 4),))
class KwargsForward(nn.Module):
    def forward(self, x, *, scale=3.0, **extra):
        return x * scale + len(extra)


@module_case(lambda: (torch.randn(2, 4, 6),))
class GroupNormGelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.gn = nn.GroupNorm(2, 4)
        self.act = nn.GELU(approximate="tanh")

    def forward(self, x):
        return self.act(self.gn(x))


@module_case(x34)
class Identity(nn.Module):
    def __init__(self):
        super().__init__()
        self.id = nn.Identity()

    def forward(self, x):
        return self.id(x) + 1


@module_case(x34)
class ParametersIteration(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        return x * len(self.a.weight) + self.a.weight.shape[0]


@module_case(x34)
class BufferInplaceUpdate(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x):
        self.count.add_(1)
        return x + self.count


@module_case(lambda: (torch.randn(2, 3, 8),))
class Conv1dLstmFree(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(3, 4, 3)
        self.pool = nn.AvgPool1d(2)

    def forward(self, x):
        return self.pool(F.relu(self.conv(x)))


@module_case(x34)
class ParametersGenerators(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Sequential(nn.Linear(4, 4))

    def forward(self, x):
        dtype = next(self.parameters()).dtype
        n = sum(1 for _ in self.modules())
        names = [k for k, _ in self.named_parameters()]
        return self.b(self.a(x)).to(dtype) * n, names


@module_case(x34)
class NamedModulesLoop(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x):
        for name, mod in self.named_children():
            if isinstance(mod, nn.Linear):
                x = mod(x)
        return x, [n for n, _ in self.named_modules()]


@module_case(x34)
class BuffersAndDevice(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.full((4,), 2.0))

    def forward(self, x):
        device = next(self.buffers()).device
        return x.to(device) * self.scale
