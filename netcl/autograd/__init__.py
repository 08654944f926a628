"""Reverse-mode autograd: `with ag.Tape() as tape:` records ops on Nodes, `tape.backward(loss)` fills `.grad`.

    import netcl.autograd as ag
    with ag.Tape() as tape:
        x = ag.tensor(x_raw)
        loss = ag.cross_entropy(model(x), ag.tensor(labels))
    tape.backward(loss)

Every elementwise function of netcl.ops is an op here, its derivative from netcl.jit.autodiff's table
(elementwise.py); every op declared in netcl.ops (netcl.ops.declaration: matmul, conv2d, pooling, norms,
softmax, attention, ...) is an op here generated from its declaration (declared.py); the others have their
backward rule beside their forward (reduce.py, movement.py, nnops.py, loss.py), calling the backward kernels
of netcl.ops. Reduced losses are Tensors of shape (1,).
"""

from netcl.autograd import (
    attention,
    declared,
    elementwise,
    engine,
    loss,
    movement,
    nnops,
    numerical,
    operators,
    reduce,
    sorting,
    transformer,
)
from netcl.autograd.attention import *  # noqa: F403
from netcl.autograd.elementwise import *  # noqa: F403  (every elementwise op of netcl.ops, on Nodes)
from netcl.autograd.engine import *  # noqa: F403
from netcl.autograd.loss import *  # noqa: F403
from netcl.autograd.movement import *  # noqa: F403
from netcl.autograd.nnops import *  # noqa: F403
from netcl.autograd.numerical import *  # noqa: F403  (gradcheck)
from netcl.autograd.reduce import *  # noqa: F403
from netcl.autograd.sorting import *  # noqa: F403
from netcl.autograd.transformer import *  # noqa: F403
from netcl.core import launch_labels
from netcl.ops import declaration

operators.install()

__all__ = [name for module in (engine, attention, elementwise, loss, movement, nnops, numerical, reduce,
                                        sorting, transformer)
           for name in module.__all__]


def _export(decl: declaration.OpDecl) -> None:
    """Each declared op is `netcl.autograd.<name>` (a new declaration too: nothing to add here)."""
    if decl.name in declared.OPS:
        globals()[decl.name] = declared.OPS[decl.name]
        if decl.name not in __all__:
            __all__.append(decl.name)


def _unexport(decl: declaration.OpDecl) -> None:
    if decl.name in __all__ and globals().get(decl.name) is not None:
        __all__.remove(decl.name)
        del globals()[decl.name]


declaration.subscribe(_export, _unexport)

launch_labels.names_ops(__name__)  # netcl.profiling: a backward rule names its launches (conv2d.backward)
