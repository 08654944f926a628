"""The fuzz table: bad (and tricky valid) input per public entry point, with what netcl must do.

Each area is a function returning Cases; `all_cases()` is the whole table. The expectations follow
NumPy and PyTorch: a size that is not an integer is a TypeError, a value outside its range a
ValueError (netcl's ShapeError is one), an index outside its range an error naming it, a scalar that
does not fit a dtype an error at the op; valid input gives NumPy's (or PyTorch's) result.
"""

from __future__ import annotations

from tests.fuzz.runner import Case, Matches, raises

# non-integer sizes, each with the words the error must show (the value as given)
BAD_SIZES = [("2.7", "2.7"), ("2.0", "2.0"), ("'12'", "'12'"), ("np.float64(3.0)", "3.0")]
SIZE_ERROR = ("TypeError",)


def sizes() -> list[Case]:
    """Every place a size is taken, with a float, an integral float, a string, a NumPy float."""
    places = {
        "empty": "Tensor.empty(q, ({s}, 3))",
        "zeros-bare": "Tensor.zeros(q, {s})",
        "ones": "Tensor.ones(q, (2, {s}))",
        "full": "Tensor.full(q, ({s},), 1.0)",
        "randn": "Tensor.randn(q, ({s}, 2))",
        "rand": "Tensor.rand(q, ({s},))",
        "randint": "Tensor.randint(q, 0, 5, ({s},))",
        "reshape": "T(np.zeros((6, 2))).reshape({s}, 4)",
        "view": "T(np.zeros((6, 2))).view(3, {s})",
        "expand": "T(np.zeros((1, 3))).expand({s}, 3)",
        "transpose": "T(np.zeros((2, 3))).transpose({s}, 0)",
        "permute": "T(np.zeros((2, 3))).permute({s}, 0)",
        "unsqueeze": "T(np.zeros((2, 3))).unsqueeze({s})",
        "sum-axis": "ops.sum(T(np.zeros((2, 3))), axis={s})",
        "softmax-axis": "ops.softmax(T(np.zeros((2, 3))), axis={s})",
        "one_hot": "ops.one_hot(T([1, 2], np.int32), {s})",
        "topk": "ops.topk(T(np.zeros((2, 6))), {s})",
        "chunk": "ops.chunk(T(np.zeros((6,))), {s})",
        "split": "ops.split(T(np.zeros((6,))), {s})",
        "pad": "ops.pad(T(np.zeros((2, 3))), ({s}, 1))",
        "repeat": "ops.repeat(T(np.zeros((2,))), {s})",
        "Linear-in": "nn.Linear(q, {s}, 3)",
        "Linear-out": "nn.Linear(q, 3, {s})",
        "Conv2d-channels": "nn.Conv2d(q, {s}, 4, 3)",
        "Conv2d-kernel": "nn.Conv2d(q, 2, 4, {s})",
        "Conv2d-stride": "nn.Conv2d(q, 2, 4, 3, stride={s})",
        "Conv2d-padding": "nn.Conv2d(q, 2, 4, 3, padding={s})",
        "Conv2d-groups": "nn.Conv2d(q, 2, 4, 3, groups={s})",
        "BatchNorm2d": "nn.BatchNorm2d(q, {s})",
        "LayerNorm": "nn.LayerNorm(q, {s})",
        "RMSNorm": "nn.RMSNorm(q, {s})",
        "Embedding-num": "nn.Embedding(q, {s}, 4)",
        "Embedding-dim": "nn.Embedding(q, 10, {s})",
        "MaxPool2d": "nn.MaxPool2d({s})(ag.tensor(T(np.zeros((1, 1, 4, 4)))))",
        "AvgPool2d": "nn.AvgPool2d({s})(ag.tensor(T(np.zeros((1, 1, 4, 4)))))",
        "AdaptiveAvgPool2d": "nn.AdaptiveAvgPool2d({s})(ag.tensor(T(np.zeros((1, 1, 4, 4)))))",
        "DataLoader": "from netcl.data import DataLoader\n"
                      "DataLoader((np.zeros((10, 2), np.float32), np.zeros(10, np.int32)), {s}, q)",
        "StepLR": "opt = optim.SGD([P([1.0])], lr=0.1)\noptim.StepLR(opt, step_size={s})",
        "CosineAnnealing": "opt = optim.SGD([P([1.0])], lr=0.1)\noptim.CosineAnnealing(opt, T_max={s})",
    }
    out = []
    for name, template in places.items():
        for value, words in BAD_SIZES:
            out.append(Case("sizes", f"{name}[{value}]", template.format(s=value), raises(*SIZE_ERROR, words=words)))
    for value, words in [("300.5", "300.5"), ("300.0", "300.0"), ("'300'", "'300'")]:  # vocab sizes clear 256
        out.append(Case("sizes", f"bpe-train[{value}]", "from netcl.text import BPETokenizer\n"
                        f"BPETokenizer.train('low lower ' * 30, vocab_size={value})", raises(*SIZE_ERROR, words=words)))
    negative = {
        "zeros": ("Tensor.zeros(q, (-1, 2))", "-1"),
        "Linear": ("nn.Linear(q, -3, 2)", "-3"),
        "Conv2d-kernel-0": ("nn.Conv2d(q, 2, 4, 0)", "kernel_size"),
        "Conv2d-groups-0": ("nn.Conv2d(q, 2, 4, 3, groups=0)", "groups"),
        "Conv2d-groups-neg": ("nn.Conv2d(q, 2, 4, 3, groups=-1)", "groups"),
        "Conv2d-stride-0": ("nn.Conv2d(q, 2, 4, 3, stride=0)", "stride"),
        "Conv2d-dilation-0": ("nn.Conv2d(q, 2, 4, 3, dilation=0)", "dilation"),
        "Conv2d-padding-neg": ("nn.Conv2d(q, 2, 4, 3, padding=-1)", "padding"),
        "Embedding-neg": ("nn.Embedding(q, -1, 4)", "-1"),
        "MaxPool2d-0": ("nn.MaxPool2d(0)(ag.tensor(T(np.zeros((1, 1, 4, 4)))))", "kernel_size"),
        "DataLoader-0": ("from netcl.data import DataLoader\n"
                         "DataLoader((np.zeros((10, 2), np.float32), np.zeros(10, np.int32)), 0, q)", "batch_size"),
        "chunk-0": ("ops.chunk(T(np.zeros((6,))), 0)", "chunks"),
        "one_hot-0": ("ops.one_hot(T([1], np.int32), 0)", "num_classes"),
        "conv-op-groups-0": ("ops.conv2d(T(np.zeros((1, 2, 4, 4))), T(np.zeros((2, 2, 3, 3))), groups=0)", "groups"),
    }
    for name, (code, words) in negative.items():
        out.append(Case("sizes", name, code, raises("ValueError", words=words)))
    return out


def creation() -> list[Case]:
    c = []
    overflow = [
        ("full-uint8-300", "host(Tensor.full(q, (2,), 300, dtype=np.uint8))", "300"),
        ("full-uint8-neg", "host(Tensor.full(q, (2,), -1, dtype=np.uint8))", "-1"),
        ("full-int32-2^40", "host(Tensor.full(q, (2,), 2**40, dtype=np.int32))", "1099511627776"),
        ("add-int32-2^40", "host(T([1, 2], np.int32) + 2**40)", "1099511627776"),
        ("add-uint8-300", "host(T([1, 2], np.uint8) + 300)", "300"),
        ("mul-int32-2^31", "host(T([1, 2], np.int32) * 2**31)", "2147483648"),
        ("fill_-uint8", "x = T([1, 2], np.uint8)\nx.fill_(256)\nhost(x)", "256"),
        ("where-int32-scalar", "host(ops.where(T([1, 0], np.uint8), T([1, 2], np.int32), 2**33))", "8589934592"),
    ]
    for name, code, words in overflow:
        c.append(Case("creation", name, code, raises("NetclError", words=words)))
    c += [
        Case("creation", "arange-past-int32", "result = ops.arange(q, 2**31 + 5, 2**31 + 9)",
             Matches("np.arange(2**31 + 5, 2**31 + 9)", dtype=False)),
        Case("creation", "arange-int32-max", "result = ops.arange(q, 2**31 - 3, 2**31)",
             Matches("np.arange(2**31 - 3, 2**31)", dtype=False)),
        Case("creation", "arange-negative-big", "result = ops.arange(q, -2**31 - 4, -2**31 - 1)",
             Matches("np.arange(-2**31 - 4, -2**31 - 1)", dtype=False)),
        Case("creation", "arange-step-0", "ops.arange(q, 0, 5, 0)", raises("ValueError", words="step")),
        Case("creation", "arange-nan", "ops.arange(q, 0, float('nan'))", raises("ValueError", words="nan")),
        Case("creation", "arange-inf", "ops.arange(q, 0, float('inf'))", raises("ValueError", words="inf")),
        Case("creation", "from_host-str", "Tensor.from_host(q, np.array(['a', 'b']))", raises("TypeError")),
        Case("creation", "from_host-complex", "Tensor.from_host(q, np.zeros(3, complex))",
             raises("TypeError", words="complex")),
        Case("creation", "from_host-object", "Tensor.from_host(q, np.array([object()]))", raises("TypeError")),
        Case("creation", "from_host-ragged", "Tensor.from_host(q, [[1.0, 2.0], [3.0]])", raises("ValueError")),
        Case("creation", "from_host-list", "result = Tensor.from_host(q, [[1.5, 2.0], [3.0, 4.0]])",
             Matches("np.array([[1.5, 2.0], [3.0, 4.0]])", dtype=False)),
        Case("creation", "full-float32-1e40", "result = Tensor.full(q, (2,), 1e40)",
             Matches("np.full(2, np.float32(np.inf))")),
        Case("creation", "empty-dtype-str-bad", "Tensor.empty(q, (2,), 'flot32')", raises("TypeError", words="flot32")),
        Case("creation", "empty-too-many-dims", "Tensor.empty(q, (1,) * 12)", raises("ValueError", words="12")),
        Case("creation", "empty-negative-bare", "Tensor.empty(q, shape=-4)", raises("ValueError", words="(-4)")),
    ]
    index = [
        ("bool-true", "x[True]", "np.arange(6.).reshape(2, 3)[True]"),
        ("bool-false", "x[False]", "np.arange(6.).reshape(2, 3)[False]"),
        ("np-bool-true", "x[np.bool_(True)]", "np.arange(6.).reshape(2, 3)[np.bool_(True)]"),
        ("bool-true-col", "x[:, True]", "np.arange(6.).reshape(2, 3)[:, True]"),
        ("none", "x[None]", "np.arange(6.).reshape(2, 3)[None]"),
        ("neg", "x[-1]", "np.arange(6.).reshape(2, 3)[-1]"),
        ("ellipsis", "x[..., 1]", "np.arange(6.).reshape(2, 3)[..., 1]"),
        ("np-int", "x[np.int64(1)]", "np.arange(6.).reshape(2, 3)[np.int64(1)]"),
        ("step-neg", "x[:, ::-1]", "np.arange(6.).reshape(2, 3)[:, ::-1]"),
    ]
    for name, expr, ref in index:
        c.append(Case("creation", f"index-{name}", f"x = T(np.arange(6.).reshape(2, 3))\nresult = {expr}",
                      Matches(ref, dtype=False)))
    bad_index = [
        ("float", "x[1.5]", ("IndexError", "TypeError"), "1.5"),
        ("out-of-range", "x[5]", ("IndexError",), "5"),
        ("str", "x['a']", ("IndexError", "TypeError"), "a"),
        ("too-many", "x[0, 0, 0]", ("IndexError",), "3"),
        ("step-0", "x[::0]", ("ValueError",), "step"),
    ]
    for name, expr, kinds, words in bad_index:
        c.append(Case("creation", f"index-{name}", f"x = T(np.arange(6.).reshape(2, 3))\n{expr}",
                      raises(*kinds, words=words)))
    return c


def numerics() -> list[Case]:
    c = []
    for name, code, ref in [
        ("var-ddof-n", "ops.var(T([1.0, 2.0, 3.0]), ddof=3)", "np.var(np.array([1.0, 2.0, 3.0], np.float32), ddof=3)"),
        ("var-ddof-big", "ops.var(T([1.0, 2.0, 3.0]), ddof=5)", "np.var(np.array([1.0, 2.0, 3.0], np.float32), ddof=5)"),
        ("var-ddof-n-const", "ops.var(T(np.ones((2, 3))), axis=1, ddof=3)", "np.var(np.ones((2, 3), np.float32), axis=1, ddof=3)"),
        ("std-ddof-n", "ops.std(T([1.0, 2.0]), ddof=2)", "np.std(np.array([1.0, 2.0], np.float32), ddof=2)"),
        ("var-ddof-1", "ops.var(T([1.0, 2.0, 4.0]), ddof=1)", "np.var(np.array([1.0, 2.0, 4.0], np.float32), ddof=1)"),
        ("mod-int-neg", "T([-7, 7, -7, 7], np.int32) % T([3, -3, -3, 3], np.int32)",
         "np.array([-7, 7, -7, 7], np.int32) % np.array([3, -3, -3, 3], np.int32)"),
        ("mod-int-scalar", "T([-7, 7, -1], np.int32) % 3", "np.array([-7, 7, -1], np.int32) % 3"),
        ("mod-int-neg-scalar", "T([-7, 7, 0], np.int32) % -3", "np.array([-7, 7, 0], np.int32) % -3"),
        ("mod-int64", "T([-9, 9], np.int64) % T([4, -4], np.int64)", "np.array([-9, 9]) % np.array([4, -4])"),
        ("mod-float-neg", "T([-7.5, 7.5]) % 2.0", "np.array([-7.5, 7.5], np.float32) % np.float32(2.0)"),
        ("mod-float-negdiv", "T([-7.5, 7.5]) % -2.0", "np.array([-7.5, 7.5], np.float32) % np.float32(-2.0)"),
        ("floordiv-int", "T([-7, 7, -1], np.int32) // 2", "np.array([-7, 7, -1], np.int32) // 2"),
        ("floordiv-int-neg", "T([-7, 7], np.int32) // T([-2, -2], np.int32)", "np.array([-7, 7], np.int32) // -2"),
        ("floordiv-zero", "T([1, -1, 0], np.int32) // 0", "np.array([0, 0, 0], np.int32)"),
        ("mod-zero", "T([1, -1, 0], np.int32) % 0", "np.array([0, 0, 0], np.int32)"),
        ("floordiv-zero-tensor", "T([5, -5], np.int32) // T([0, 0], np.int32)", "np.array([0, 0], np.int32)"),
        ("floordiv-int-min", "T([-2**31, 7], np.int32) // -1", "np.array([-2**31, 7], np.int32) // -1"),
        ("mod-int-min", "T([-2**31, 7], np.int32) % -1", "np.array([-2**31, 7], np.int32) % -1"),
        ("floordiv-int64-min", "T([-2**63], np.int64) // T([-1], np.int64)", "np.array([-2**63]) // -1"),
        ("pow-int-neg-base", "T([-2, 3, -1], np.int32) ** 3", "np.array([-2, 3, -1], np.int32) ** 3"),
        ("pow-float-neg", "T([-8.0, 4.0]) ** 0.5", "np.array([-8.0, 4.0], np.float32) ** np.float32(0.5)"),
        ("mean-empty", "ops.mean(T(np.zeros((0,))))", "np.float32(np.nan)"),
        ("sum-empty", "ops.sum(T(np.zeros((0, 3))), axis=0)", "np.zeros(3, np.float32)"),
        ("abs-int-min", "abs(T([-2**31], np.int32))", "np.abs(np.array([-2**31], np.int32))"),
    ]:
        c.append(Case("numerics", name, f"result = {code}", Matches(ref, rtol=1e-6, atol=1e-6)))
    c += [
        Case("numerics", "pow-int-neg-scalar", "T([2, 3], np.int32) ** -1", raises("ValueError", words="negative")),
        Case("numerics", "pow-int-tensor-neg-exp", "T([2, 1, -1], np.int32) ** T([-1, -2, -3], np.int32)",
             raises("ValueError", words="holding -3")),  # NumPy refuses it; PyTorch's silent 0 was taken
        Case("numerics", "max-empty", "host(ops.max(T(np.zeros((0,)))))", raises("ValueError", words="zero-size")),
        Case("numerics", "argmax-empty", "host(ops.argmax(T(np.zeros((0,)))))", raises("ValueError", words="zero-size")),
    ]
    return c


_PEAKED = """
rng = np.random.default_rng(0)
x = (rng.standard_normal({shape}) * {scale}).astype(np.float32)
g = rng.standard_normal({shape}).astype(np.float32)
x64, g64 = x.astype(np.float64), g.astype(np.float64)
y64 = np.exp(x64 - x64.max(-1, keepdims=True)); y64 /= y64.sum(-1, keepdims=True)
xn = ag.tensor(T(x), requires_grad=True)
with ag.Tape() as tape:
{body}
result = host(xn.grad)
"""


def precision() -> list[Case]:
    """Gradients of softmax-like ops on peaked rows (logits of large magnitude), against float64 with
    PyTorch float32's accuracy as the bar."""
    c = []
    for shape, scale in [("(8, 100)", 30), ("(8, 1000)", 1000), ("(4, 2048)", 100), ("(16, 64)", 300)]:
        rows = shape.strip("()").split(",")[0]
        cases = {
            "softmax": ("    out = ag.softmax(xn, axis=-1)\ntape.backward(out, T(g))",
                        "y64 * (g64 - (g64 * y64).sum(-1, keepdims=True))", 1e-3),
            "log_softmax": ("    out = ag.log_softmax(xn, axis=-1)\ntape.backward(out, T(g))",
                            "g64 - y64 * g64.sum(-1, keepdims=True)", 1e-5),
            "cross_entropy": (f"    lab = rng.integers(0, x.shape[-1], {rows}).astype(np.int32)\n"
                              "    out = ag.cross_entropy(xn, T(lab, np.int32))\ntape.backward(out)",
                              f"(y64 - np.eye(x.shape[-1])[lab]) / {rows}", 1e-5),
            # the rounded lse (ulp 2.4e-4 at 3000) bounds both PyTorch's float32 (1.2e-4 on (8, 1000) x 1000)
            # and netcl's, which computes the same exp(x - lse)
            "logsumexp": ("    out = ag.logsumexp(xn, axis=-1)\ngs = np.ones(x.shape[0], np.float32)\n"
                          "tape.backward(out, T(gs))", "y64", 2e-4),
        }
        for op, (body, ref, rel) in cases.items():
            code = _PEAKED.format(shape=shape, scale=scale, body=body)
            # the bar: |error| <= rel * max|reference| (float32 PyTorch meets it on every row here)
            c.append(Case("precision", f"{op}{shape}x{scale}", code,
                          Matches(f"{ref}", rtol=0.0, atol=f"{rel} * np.abs({ref}).max()", dtype=False)))
    return c


def autograd() -> list[Case]:
    twice = ("x = ag.tensor(T([1.0, 2.0]), requires_grad=True)\n"
             "with ag.Tape() as tape:\n    h = x * 2\n    y = ops_sum(h)\n    z = ops_sum(h * 3)\n")
    prelude = "ops_sum = lambda n: ag.sum(n)\n"
    return [
        Case("autograd", "backward-through-freed-intermediate",
             prelude + twice + "tape.backward(y)\ntape.backward(z)\nresult = host(x.grad)",
             raises("NetclError", words=("retain_graph",))),
        Case("autograd", "retain-graph", prelude + twice
             + "tape.backward(y, retain_graph=True)\ntape.backward(z)\nresult = host(x.grad)",
             Matches("np.array([8.0, 8.0], np.float32)")),
        Case("autograd", "double-backward-same-root", prelude + twice + "tape.backward(y)\ntape.backward(y)",
             raises("NetclError", words="retain_graph")),
        Case("autograd", "int-leaf-requires-grad", "ag.tensor(T([1, 2], np.int32), requires_grad=True)",
             raises("NetclError", "TypeError", words="floating")),
        Case("autograd", "int-parameter", "ag.Parameter(T([1, 2], np.int32))",
             raises("NetclError", "TypeError", words="floating")),
        Case("autograd", "int-leaf-no-grad-ok", "result = host(ag.tensor(T([1, 2], np.int32)))",
             Matches("np.array([1, 2], np.int32)")),
        Case("autograd", "grad-on-another-queue",
             "x = ag.tensor(T([1.0, 2.0]), requires_grad=True)\n"
             "with ag.Tape() as tape:\n    y = x * 2\n"
             "tape.backward(y, Tensor.from_host(q.device.new_queue(), np.ones(2, np.float32)))",
             raises("DeviceMismatchError", words="grad.to(output.queue)")),
        Case("autograd", "gradient-non-leaf",
             "x = ag.tensor(T([1.0, 2.0, 3.0]), requires_grad=True)\n"
             "with ag.Tape() as tape:\n    h = x * x\n    y = ag.sum(h * 2)\n"
             "result = host(tape.gradient(y, [h])[0])",
             Matches("np.array([2.0, 2.0, 2.0], np.float32)")),
        Case("autograd", "gradient-leaf-and-non-leaf",
             "x = ag.tensor(T([1.0, 2.0, 3.0]), requires_grad=True)\n"
             "with ag.Tape() as tape:\n    h = x * x\n    y = ag.sum(h * 2)\n"
             "gx, gh = tape.gradient(y, [x, h])\nresult = np.concatenate([host(gx), host(gh)])",
             Matches("np.array([4.0, 8.0, 12.0, 2.0, 2.0, 2.0], np.float32)")),
        Case("autograd", "gradient-no-grad-node",
             "x = ag.tensor(T([1.0, 2.0]), requires_grad=True)\nc = ag.tensor(T([1.0, 1.0]))\n"
             "with ag.Tape() as tape:\n    y = ag.sum(x * c)\ntape.gradient(y, [c])",
             raises("NetclError", "ValueError", words="require grad")),
        Case("autograd", "gradient-unused-node",
             "x = ag.tensor(T([1.0, 2.0]), requires_grad=True)\nw = ag.tensor(T([1.0]), requires_grad=True)\n"
             "with ag.Tape() as tape:\n    y = ag.sum(x * 2)\ntape.gradient(y, [w])",
             raises("NetclError", "ValueError", words="not used")),
        Case("autograd", "backward-grad-shape",
             "x = ag.tensor(T([1.0, 2.0]), requires_grad=True)\nwith ag.Tape() as tape:\n    y = x * 2\n"
             "tape.backward(y, T([1.0, 2.0, 3.0]))", raises("ValueError", words="shape")),
        Case("autograd", "backward-nonscalar",
             "x = ag.tensor(T([1.0, 2.0]), requires_grad=True)\nwith ag.Tape() as tape:\n    y = x * 2\n"
             "tape.backward(y)", raises("ValueError", words="grad")),
        Case("autograd", "backward-not-node", "ag.backward(T([1.0]))", raises("TypeError")),
        Case("autograd", "backward-grad-dtype",
             "x = ag.tensor(T([1.0, 2.0]), requires_grad=True)\nwith ag.Tape() as tape:\n    y = x * 2\n"
             "tape.backward(y, T([1, 2], np.int32))", raises("NetclError", "TypeError", words="dtype")),
        Case("autograd", "accumulate-two-tapes",
             "x = ag.tensor(T([1.0, 2.0]), requires_grad=True)\n"
             "for _ in range(2):\n    with ag.Tape() as tape:\n        y = ag.sum(x * x)\n    tape.backward(y)\n"
             "result = host(x.grad)", Matches("np.array([4.0, 8.0], np.float32)")),
    ]


_MODULE = """
class M(nn.Module):
    def __init__(self):
        super().__init__()
{body}
m = M()
"""


def modules() -> list[Case]:
    def mod(body: str, then: str) -> str:
        return _MODULE.format(body="\n".join("        " + ln for ln in body.splitlines())) + then

    return [
        Case("nn", "none-then-module", mod("self.down = None\nself.down = nn.Linear(q, 2, 2)",
                                           "result = type(m.down).__name__"), Matches("'Linear'")),
        Case("nn", "none-then-module-params", mod("self.down = None\nself.down = nn.Linear(q, 2, 2)",
                                                  "result = sorted(n for n, _ in m.named_parameters())"),
             Matches("['down.bias', 'down.weight']")),
        Case("nn", "value-then-parameter", mod("self.w = 3\nself.w = P([1.0])", "result = type(m.w).__name__"),
             Matches("'Parameter'")),
        Case("nn", "none-then-parameter-in-state", mod("self.w = None\nself.w = P([1.0])",
                                                       "result = list(m.state_dict())"), Matches("['w']")),
        Case("nn", "buffer-reassigned-with-tensor",
             mod("self.register_buffer('rm', T([0.0]))", "m.rm = T([5.0])\nresult = host(m.state_dict()['rm'])"),
             Matches("np.array([5.0], np.float32)")),
        Case("nn", "buffer-reassigned-with-number", mod("self.register_buffer('rm', T([0.0]))", "m.rm = 5"),
             raises("TypeError", words="rm")),
        Case("nn", "parameter-assigned-number", "lin = nn.Linear(q, 2, 2)\nlin.weight = 3",
             raises("TypeError", words="weight")),
        Case("nn", "parameter-assigned-none", "lin = nn.Linear(q, 2, 2)\nlin.bias = None\n"
             "result = (lin.bias, sorted(n for n, _ in lin.named_parameters()))", Matches("(None, ['weight'])")),
        Case("nn", "module-assigned-number", mod("self.down = nn.Linear(q, 2, 2)", "m.down = 4"),
             raises("TypeError", words="down")),
        Case("nn", "module-assigned-none", mod("self.down = nn.Linear(q, 2, 2)",
                                                "m.down = None\nresult = (m.down, list(m.state_dict()))"),
             Matches("(None, [])")),
        Case("nn", "delete-child", mod("self.down = nn.Linear(q, 2, 2)",
                                        "del m.down\nresult = (hasattr(m, 'down'), list(m.state_dict()))"),
             Matches("(False, [])")),
        Case("nn", "replace-child", mod("self.down = nn.Linear(q, 2, 2)",
                                         "m.down = nn.Linear(q, 2, 3)\nresult = tuple(m.down.weight.shape)"),
             Matches("(3, 2)")),
        Case("nn", "parameter-then-plain-attr", mod("self.w = P([1.0])", "del m.w\nm.w = 7\nresult = (m.w, list(m.state_dict()))"),
             Matches("(7, [])")),
        Case("nn", "plain-tensor-is-not-state", mod("self.t = T([1.0])", "result = list(m.state_dict())"),
             Matches("[]")),
        Case("nn", "register_parameter-not-parameter", mod("self.register_parameter('w', T([1.0]))", ""),
             raises("TypeError", words="w")),
        Case("nn", "register_buffer-bad-name", mod("self.register_buffer('a.b', T([1.0]))", ""),
             raises("KeyError", "ValueError", words="a.b")),
        Case("nn", "add_module-not-module", mod("self.add_module('x', 3)", ""), raises("TypeError", words="x")),
        Case("nn", "no-super-init", "class B(nn.Module):\n    def __init__(self):\n        self.w = P([1.0])\nB()",
             raises("NetclError", words="super().__init__()")),
        Case("nn", "Dropout-p-big", "nn.Dropout(1.5)", raises("ValueError", words="1.5")),
        Case("nn", "Dropout-p-str", "nn.Dropout('0.5')", raises("TypeError", words="0.5")),
        Case("nn", "Dropout-p-nan", "nn.Dropout(float('nan'))", raises("ValueError", words="nan")),
        Case("nn", "Linear-forward-shape", "nn.Linear(q, 3, 2)(ag.tensor(T(np.zeros((4, 5)))))",
             raises("ValueError", words="3")),
        Case("nn", "load_state_dict-shape", "lin = nn.Linear(q, 2, 2)\nlin.load_state_dict({'weight': np.zeros((3, 2), np.float32), 'bias': np.zeros(2, np.float32)})",
             raises("NetclError", words="shape")),
        Case("nn", "load_state_dict-not-dict", "nn.Linear(q, 2, 2).load_state_dict([1, 2])",
             raises("TypeError", words="list")),
        Case("nn", "Embedding-negative-id", "emb = nn.Embedding(q, 10, 3)\nhost(emb(ag.tensor(T([1, -1], np.int32))))",
             raises("NetclError", words="-1")),
        Case("nn", "embedding-op-negative-id", "host(ops.embedding(T(np.zeros((5, 2))), T([-2], np.int32)))",
             raises("NetclError", words="-2")),
        Case("nn", "Embedding-too-big-id", "emb = nn.Embedding(q, 10, 3)\nhost(emb(ag.tensor(T([10], np.int32))))",
             raises("NetclError", words="10")),
        Case("nn", "Embedding-float-ids", "nn.Embedding(q, 10, 3)(ag.tensor(T([1.0])))",
             raises("TypeError", words="int")),
        Case("nn", "BatchNorm2d-wrong-channels", "nn.BatchNorm2d(q, 3)(ag.tensor(T(np.zeros((2, 4, 2, 2)))))",
             raises("ValueError", words="3")),
        Case("nn", "Sequential-not-module", "nn.Sequential(nn.ReLU(), 3)", raises("TypeError", words="int")),
    ]


def losses() -> list[Case]:
    c = []
    x = "xn = ag.tensor(T(np.zeros((2, 3))), requires_grad=True)\n"
    for name, labels, words in [("label-too-big", "[0, 3]", "3"), ("label-negative", "[-2, 1]", "-2"),
                                ("label-huge", "[0, 1000000]", "1000000")]:
        for op in ("cross_entropy", "nll"):
            c.append(Case("losses", f"{op}-{name}", x + f"host(ag.{op}(xn, T({labels}, np.int32)))",
                          raises("NetclError", words=words)))
    c += [
        Case("losses", "cross_entropy-ignore-index",
             x + "result = host(ag.cross_entropy(xn, T([-100, 1], np.int32)))",
             Matches("np.array([np.log(3.0)], np.float32)")),
        Case("losses", "cross_entropy-all-ignored",
             x + "result = host(ag.cross_entropy(xn, T([-100, -100], np.int32)))",
             Matches("np.array([np.nan], np.float32)")),
        Case("losses", "cross_entropy-float-labels", x + "ag.cross_entropy(xn, T([0.0, 1.0]))",
             raises("TypeError", words="int")),
        Case("losses", "cross_entropy-shape", x + "ag.cross_entropy(xn, T([0, 1, 2], np.int32))",
             raises("ValueError", words="shape")),
        Case("losses", "cross_entropy-reduction", x + "ag.cross_entropy(xn, T([0, 1], np.int32), reduction='avg')",
             raises("ValueError", words="avg")),
        Case("losses", "cross_entropy-smoothing", x + "ag.cross_entropy(xn, T([0, 1], np.int32), label_smoothing=1.5)",
             raises("ValueError", words="1.5")),
        Case("losses", "cross_entropy-labels-list", x + "ag.cross_entropy(xn, [0, 1])", raises("TypeError", words="list")),
        Case("losses", "mse-shape", x + "ag.mse_loss(xn, T(np.zeros((2, 4))))", raises("ValueError", words="shape")),
        Case("losses", "one_hot-negative", "host(ops.one_hot(T([-1, 1], np.int32), 3))", raises("NetclError", words="-1")),
        Case("losses", "gather-out-of-range", "host(ops.gather(T(np.zeros((2, 3))), 1, T([[0], [3]], np.int32)))",
             raises("NetclError", words="3")),
    ]
    return c


def optimizers() -> list[Case]:
    c = []
    p = "p = P([1.0, 2.0])\n"
    bad = [
        ("SGD-lr-nan", "optim.SGD([p], lr=float('nan'))", "ValueError", "lr"),
        ("SGD-lr-neg", "optim.SGD([p], lr=-0.1)", "ValueError", "lr"),
        ("SGD-lr-str", "optim.SGD([p], lr='0.1')", "TypeError", "lr"),
        ("SGD-lr-none", "optim.SGD([p], lr=None)", "TypeError", "lr"),
        ("SGD-momentum-neg", "optim.SGD([p], lr=0.1, momentum=-0.5)", "ValueError", "momentum"),
        ("SGD-wd-neg", "optim.SGD([p], lr=0.1, weight_decay=-1.0)", "ValueError", "weight_decay"),
        ("SGD-nesterov-no-momentum", "optim.SGD([p], lr=0.1, nesterov=True)", "ValueError", "nesterov"),
        ("Adam-lr-nan", "optim.Adam([p], lr=float('nan'))", "ValueError", "lr"),
        ("Adam-lr-inf", "optim.Adam([p], lr=float('inf'))", "ValueError", "lr"),
        ("Adam-beta1-big", "optim.Adam([p], betas=(1.5, 0.9))", "ValueError", "beta"),
        ("Adam-beta2-neg", "optim.Adam([p], betas=(0.9, -0.1))", "ValueError", "beta"),
        ("Adam-betas-str", "optim.Adam([p], betas='0.9')", "TypeError", "betas"),
        ("Adam-betas-one", "optim.Adam([p], betas=(0.9,))", "ValueError", "betas"),
        ("Adam-eps-neg", "optim.Adam([p], eps=-1e-8)", "ValueError", "eps"),
        ("Adam-eps-nan", "optim.Adam([p], eps=float('nan'))", "ValueError", "eps"),
        ("AdamW-wd-nan", "optim.AdamW([p], weight_decay=float('nan'))", "ValueError", "weight_decay"),
        ("RMSprop-alpha-neg", "optim.RMSprop([p], alpha=-0.5)", "ValueError", "alpha"),
        ("RMSprop-eps-str", "optim.RMSprop([p], eps='x')", "TypeError", "eps"),
        ("group-lr-nan", "optim.SGD([{'params': [p], 'lr': float('nan')}], lr=0.1)", "ValueError", "lr"),
        ("group-no-params", "optim.SGD([{'lr': 0.1}], lr=0.1)", "ValueError", "params"),
        ("empty-params", "optim.SGD([], lr=0.1)", "ValueError", "empty"),
        ("single-parameter", "optim.SGD(p, lr=0.1)", "TypeError", "iterable"),
        ("params-numbers", "optim.SGD([1, 2], lr=0.1)", "TypeError", "int"),
        ("params-in-two-groups", "optim.SGD([{'params': [p]}, {'params': [p]}], lr=0.1)", "ValueError", "more than one"),
        ("unknown-group-key", "optim.SGD([{'params': [p], 'lrr': 0.1}], lr=0.1)", "ValueError", "lrr"),
    ]
    for name, code, kind, words in bad:
        c.append(Case("optim", name, p + code, raises(kind, words=words)))
    c += [
        Case("optim", "SGD-step-valid", p + "opt = optim.SGD([p], lr=0.5)\np.grad = T([1.0, 1.0])\nopt.step()\n"
             "result = host(p)", Matches("np.array([0.5, 1.5], np.float32)")),
        Case("optim", "load-adam-into-sgd", p + "a = optim.Adam([p])\ns = optim.SGD([p], lr=0.1)\n"
             "s.load_state_dict(a.state_dict())", raises("ValueError", "NetclError", words=("Adam", "SGD"))),
        Case("optim", "load-empty-dict", p + "optim.SGD([p], lr=0.1).load_state_dict({})",
             raises("ValueError", "NetclError", words="param_groups")),
        Case("optim", "load-lr-nan", p + "s = optim.SGD([p], lr=0.1)\nsd = s.state_dict()\n"
             "sd['param_groups'][0]['lr'] = float('nan')\ns.load_state_dict(sd)", raises("ValueError", words="lr")),
        Case("optim", "load-lr-nan-keeps-state", p + "s = optim.SGD([p], lr=0.1)\nsd = s.state_dict()\n"
             "sd['param_groups'][0]['lr'] = float('nan')\ntry:\n    s.load_state_dict(sd)\nexcept ValueError:\n    pass\n"
             "result = s.param_groups[0]['lr']", Matches("0.1")),
        Case("optim", "load-wrong-group-count", p + "s = optim.SGD([p], lr=0.1)\nsd = s.state_dict()\n"
             "sd['param_groups'] = sd['param_groups'] * 2\ns.load_state_dict(sd)", raises("ValueError", words="group")),
        Case("optim", "load-state-not-dict", p + "optim.SGD([p], lr=0.1).load_state_dict('x')",
             raises("TypeError", words="str")),
        Case("optim", "load-state-wrong-shape", p + "a = optim.Adam([p])\np.grad = T([1.0, 1.0])\na.step()\n"
             "sd = a.state_dict()\nkey = next(iter(sd['state']))\n"
             "sd['state'][key] = {k: (np.zeros(5, np.float32) if isinstance(v, np.ndarray) else v)"
             " for k, v in sd['state'][key].items()}\na.load_state_dict(sd)", raises("ValueError", words="shape")),
        Case("optim", "clip-negative", p + "p.grad = T([3.0, 4.0])\noptim.clip_grad_norm_([p], -1.0)",
             raises("ValueError", words="-1")),
        Case("optim", "clip-nan", p + "p.grad = T([3.0, 4.0])\noptim.clip_grad_norm_([p], float('nan'))",
             raises("ValueError", words="nan")),
        Case("optim", "clip-valid", p + "p.grad = T([3.0, 4.0])\nn = optim.clip_grad_norm_([p], 1.0)\n"
             "result = host(p.grad)", Matches("np.array([0.6, 0.8], np.float32)", rtol=1e-5)),
        Case("optim", "StepLR-gamma-str", p + "o = optim.SGD([p], lr=0.1)\noptim.StepLR(o, 2, gamma='0.1')",
             raises("TypeError", words="gamma")),
        Case("optim", "scheduler-not-optimizer", "optim.StepLR(3, 2)", raises("TypeError", words="int")),
    ]
    return c


_CKPT = """
from netcl.io import save_checkpoint, load_checkpoint, read_checkpoint
from netcl.io.checkpoint import FORMAT
from safetensors.numpy import load_file, save_file
model = nn.Linear(q, 2, 2)
opt = optim.Adam(model.parameters())
path = TMP + '/c.safetensors'
save_checkpoint(path, model, opt, epoch=1)
tensors = load_file(path)
_, meta = read_checkpoint(path)
"""


def checkpoints() -> list[Case]:
    c = []
    corrupt = {
        "not-json": "'not json'",
        "json-list": "'[1, 2]'",
        "no-format": "json.dumps({k: v for k, v in meta.items() if k != 'format'})",
        "no-model-keys": "json.dumps({k: v for k, v in meta.items() if k != 'model_keys'})",
        "model-keys-not-list": "json.dumps({**meta, 'model_keys': 5})",
        "epoch-str": "json.dumps({**meta, 'epoch': 'x'})",
        "extra-list": "json.dumps({**meta, 'extra': [1]})",
        "optimizer-not-dict": "json.dumps({**meta, 'optimizer': 3})",
        "optimizer-no-type": "json.dumps({**meta, 'optimizer': {k: v for k, v in meta['optimizer'].items() if k != 'type'}})",
        "optimizer-groups-missing": "json.dumps({**meta, 'optimizer': {k: v for k, v in meta['optimizer'].items() if k != 'param_groups'}})",
        "rng-garbage": "json.dumps({**meta, 'rng': {'netcl': 'x'}})",
        "model-key-missing-tensor": "json.dumps({**meta, 'model_keys': meta['model_keys'] + ['ghost']})",
    }
    for name, metadata in corrupt.items():
        code = _CKPT + f"save_file(tensors, path, metadata={{'netcl': {metadata}}})\nload_checkpoint(path, model, opt)"
        c.append(Case("checkpoint", name, code, raises("CheckpointError")))
    for cut in (0, 8, 20, 200):
        code = _CKPT + f"data = open(path, 'rb').read()\nopen(path, 'wb').write(data[:{cut}] if {cut} else b'')\n" \
                       "load_checkpoint(path, model, opt)"
        c.append(Case("checkpoint", f"truncated-{cut}", code, raises("CheckpointError")))
    c += [
        Case("checkpoint", "no-metadata", _CKPT + "save_file(tensors, path)\nload_checkpoint(path, model)",
             raises("CheckpointError", words="netcl")),
        Case("checkpoint", "directory", _CKPT + "load_checkpoint(TMP, model)", raises("CheckpointError")),
        Case("checkpoint", "untouched-on-failure", _CKPT
             + "before = host(model.weight).copy()\nsave_file(tensors, path, metadata={'netcl': json.dumps({**meta, 'optimizer': 3})})\n"
             "try:\n    load_checkpoint(path, model, opt)\nexcept errors.NetclError:\n    pass\nresult = host(model.weight)",
             Matches("before")),
    ]
    return c


def data() -> list[Case]:
    import struct

    def idx(body: str, name: str = "a.idx") -> str:
        return f"from netcl.data import read_idx\np = TMP + '/{name}'\nopen(p, 'wb').write({body})\nread_idx(p)"

    header = struct.pack(">HBB3I", 0, 8, 3, 5, 4, 3)
    c = [
        Case("data", "idx-header-cut", idx(repr(header[:6])), raises("NetclError", words="a.idx")),
        Case("data", "idx-dims-cut", idx(repr(header[:9])), raises("NetclError", words="a.idx")),
        Case("data", "idx-body-short", idx(repr(header + bytes(10))), raises("NetclError", words="a.idx")),
        Case("data", "idx-empty", idx("b''"), raises("NetclError", words="a.idx")),
        Case("data", "idx-bad-magic", idx(repr(b"\x01\x02\x08\x01" + bytes(8))), raises("NetclError", words="a.idx")),
        Case("data", "idx-ndim-0", idx(repr(b"\x00\x00\x08\x00")), raises("NetclError", words="a.idx")),
        Case("data", "idx-gz-truncated", "import gzip\nfrom netcl.data import read_idx\np = TMP + '/a.idx.gz'\n"
             f"blob = gzip.compress({header + bytes(60)!r})\nopen(p, 'wb').write(blob[:len(blob) // 2])\nread_idx(p)",
             raises("NetclError", words="a.idx.gz")),
        Case("data", "idx-gz-not-gzip", idx(repr(header + bytes(60)), "b.idx.gz"), raises("NetclError", words="b.idx.gz")),
        Case("data", "idx-missing", "from netcl.data import read_idx\nread_idx(TMP + '/none.idx')",
             raises("NetclError", "FileNotFoundError", words="none.idx")),
        Case("data", "ArrayDataset-rows", "from netcl.data import ArrayDataset\nArrayDataset(np.zeros(4), np.zeros(3))",
             raises("ValueError", words="3")),
        Case("data", "DataLoader-not-arrays", "from netcl.data import DataLoader\nDataLoader(5, 2, q)",
             raises("TypeError", words="int")),
        Case("data", "DataLoader-shuffle-seed-str",
             "from netcl.data import DataLoader\nDataLoader((np.zeros((4, 2), np.float32),), 2, q, seed='x')",
             raises("TypeError", words="seed")),
    ]
    return c


_TOK = """
from netcl.text import BPETokenizer, ChatFormat
from netcl.text import formats
tok = BPETokenizer.train('low lower lowest newer newest ' * 40, vocab_size=283,
                         special_tokens=['<|im_start|>', '<|im_end|>', '<|endoftext|>'])
"""


def text() -> list[Case]:
    hf = ("good = TMP + '/good.json'\ntok.save_hf(good)\nimport copy\nspec = json.load(open(good))\n"
          "bad = TMP + '/bad.json'\n")
    c = [
        Case("text", "decode-float", _TOK + "tok.decode([1.0])", raises("TypeError", words="1.0")),
        Case("text", "decode-bool", _TOK + "tok.decode([True])", raises("TypeError", words="True")),
        Case("text", "decode-negative", _TOK + "tok.decode([-1])", raises("NetclError", "ValueError", words="-1")),
        Case("text", "decode-too-big", _TOK + "tok.decode([10**6])", raises("NetclError", "ValueError", words="1000000")),
        Case("text", "decode-str", _TOK + "tok.decode('abc')", raises("TypeError", words="str")),
        Case("text", "encode-int", _TOK + "tok.encode(123)", raises("TypeError", words="int")),
        Case("text", "encode-bytes", _TOK + "tok.encode(b'abc')", raises("TypeError", words="bytes")),
        Case("text", "roundtrip-uncovered-pattern",
             "from netcl.text import BPETokenizer\n"
             "tok = BPETokenizer.train('ab cd ef ' * 40, vocab_size=270, pattern=r'[a-z]+')\n"
             "result = tok.decode(tok.encode('ab 12 cd!'))", Matches("'ab 12 cd!'")),
        Case("text", "train-vocab-small", "from netcl.text import BPETokenizer\nBPETokenizer.train('abc', vocab_size=100)",
             raises("ValueError", words="100")),
        Case("text", "train-vocab-str", "from netcl.text import BPETokenizer\nBPETokenizer.train('abc', vocab_size='300')",
             raises("TypeError", words="300")),
        Case("text", "special-not-str", "from netcl.text import BPETokenizer\n"
             "BPETokenizer.train('abc ' * 30, vocab_size=270, special_tokens=[5])", raises("TypeError", words="5")),
        Case("text", "tiktoken-duplicate-bytes", _TOK + "p = TMP + '/r.tiktoken'\ntok.save_tiktoken(p)\n"
             "lines = open(p).read().splitlines()\nlines.append(lines[0].split()[0] + ' ' + str(len(lines) + 5))\n"
             "open(p, 'w').write('\\n'.join(lines) + '\\n')\nBPETokenizer.from_tiktoken(p, pattern='cl100k')",
             raises("NetclError", words="r.tiktoken")),
        Case("text", "tiktoken-empty-only-pattern", _TOK + "p = TMP + '/r.tiktoken'\ntok.save_tiktoken(p)\n"
             "BPETokenizer.from_tiktoken(p, pattern='')", raises("ValueError", words="only empty strings")),
        Case("text", "tiktoken-bad-line", _TOK + "p = TMP + '/r.tiktoken'\nopen(p, 'w').write('abc\\n')\n"
             "BPETokenizer.from_tiktoken(p, pattern='cl100k')", raises("NetclError", words="r.tiktoken")),
        Case("text", "tiktoken-bad-rank", _TOK + "p = TMP + '/r.tiktoken'\nopen(p, 'w').write('YQ== x\\n')\n"
             "BPETokenizer.from_tiktoken(p, pattern='cl100k')", raises("NetclError", words="r.tiktoken")),
        Case("text", "chat-missing-role", _TOK + "ChatFormat(tok, 'chatml').encode_dialog([{'content': 'hi'}])",
             raises("NetclError", "ValueError", "KeyError", words="role")),
        Case("text", "chat-content-int", _TOK + "ChatFormat(tok, 'chatml').encode_dialog([{'role': 'user', 'content': 5}])",
             raises("TypeError", words="content")),
        Case("text", "chat-unknown-template", _TOK + "ChatFormat(tok, 'nonesuch')", raises("ValueError", words="nonesuch")),
    ]
    hf_bad = {
        "not-json": "open(bad, 'w').write('{not json')",
        "list": "open(bad, 'w').write('[]')",
        "no-model": "json.dump({k: v for k, v in spec.items() if k != 'model'}, open(bad, 'w'))",
        "model-list": "json.dump({**spec, 'model': []}, open(bad, 'w'))",
        "vocab-list": "json.dump({**spec, 'model': {**spec['model'], 'vocab': [1, 2]}}, open(bad, 'w'))",
        "vocab-id-str": "v = dict(spec['model']['vocab']); k = next(iter(v)); v[k] = 'x'\n"
                        "json.dump({**spec, 'model': {**spec['model'], 'vocab': v}}, open(bad, 'w'))",
        "vocab-duplicate-id": "v = dict(spec['model']['vocab']); ks = list(v); v[ks[1]] = v[ks[0]]\n"
                              "json.dump({**spec, 'model': {**spec['model'], 'vocab': v}}, open(bad, 'w'))",
        "merges-int": "json.dump({**spec, 'model': {**spec['model'], 'merges': 5}}, open(bad, 'w'))",
        "merge-three-parts": "json.dump({**spec, 'model': {**spec['model'], 'merges': ['a b c']}}, open(bad, 'w'))",
        "added-tokens-str": "json.dump({**spec, 'added_tokens': 'x'}, open(bad, 'w'))",
        "added-token-no-id": "json.dump({**spec, 'added_tokens': [{'content': 'X'}]}, open(bad, 'w'))",
        "model-type-wrong": "json.dump({**spec, 'model': {**spec['model'], 'type': 'WordPiece'}}, open(bad, 'w'))",
        "pre-tokenizer-garbage": "json.dump({**spec, 'pre_tokenizer': 5}, open(bad, 'w'))",
        "truncated": "open(bad, 'w').write(open(good).read()[:40])",
    }
    for name, write in hf_bad.items():
        c.append(Case("text", f"hf-{name}", _TOK + hf + write + "\nBPETokenizer.from_hf(bad)",
                      raises("NetclError", words="bad.json")))
    return c


def memory() -> list[Case]:
    return [
        Case("memory", "beyond-global-memory",
             "caps = dev.capabilities\nn = caps.global_mem // caps.max_alloc + 2\n"
             "keep = [Tensor.empty(q, (caps.max_alloc // 4,)) for _ in range(n)]",
             raises("OutOfMemoryError", words=("netcl already holds",))),
        Case("memory", "beyond-largest-allocation", "Tensor.empty(q, (dev.capabilities.max_alloc // 4 + 1024,))",
             raises("OutOfMemoryError", words="largest")),
        Case("memory", "huge-shape", "Tensor.empty(q, (2**40, 2**40))", raises("OutOfMemoryError", "ValueError")),
        Case("memory", "freed-memory-reused",
             "caps = dev.capabilities\nn = caps.global_mem // caps.max_alloc + 2\n"
             "for _ in range(n):\n    t = Tensor.empty(q, (caps.max_alloc // 4,))\n    del t\nresult = 1",
             Matches("1")),
    ]


def all_cases() -> list[Case]:
    return sizes() + creation() + numerics() + precision() + autograd() + modules() + losses() + optimizers() \
        + checkpoints() + data() + text() + memory()
