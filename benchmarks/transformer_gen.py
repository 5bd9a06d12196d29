"""Generate an L-layer pre-norm transformer as .ncd text (for scaling benchmarks and tests).

Each layer: rmsnorm, multi-head self-attention (keys renamed from the token axis t to x),
a residual add, rmsnorm, a GELU MLP and a second residual. The theorem rewrites every
layer's softmax-then-contract with the normalised-contraction lemma and tiles the batch
axis, so checking it exercises the kernel once per layer.
"""

from __future__ import annotations

HEADER = """\
axis b, t, x
axis h = 8
axis k = 64
axis e = 512
axis f = 2048
"""


def layer(i: int) -> str:
    return f"""\
  N{i} = rmsnorm[e](X{i})
  Q{i} = contract[e](N{i}, Wq{i})
  K{i} = rename[t -> x](contract[e](N{i}, Wk{i}))
  V{i} = rename[t -> x](contract[e](N{i}, Wv{i}))
  S{i} = contract[k](Q{i}, K{i}) * rsqrt(k)
  P{i} = softmax[x](S{i})
  A{i} = contract[x](P{i}, V{i})
  R{i} = X{i} + contract[h k](A{i}, Wo{i})
  M{i} = rmsnorm[e](R{i})
  X{i + 1} = R{i} + contract[f](gelu(contract[e](M{i}, W1{i})), W2{i})
"""


def model(layers: int) -> str:
    """The .ncd text of an L-layer model `transformer` and its theorem `fused_transformer`."""
    params = ["X0: [b t e]"]
    for i in range(layers):
        params += [f"Wq{i}: [e h k]", f"Wk{i}: [e h k]", f"Wv{i}: [e h k]", f"Wo{i}: [h k e]",
                   f"W1{i}: [e f]", f"W2{i}: [f e]"]
    body = "".join(layer(i) for i in range(layers))
    steps = "".join(f"  rewrite softmax_contract at P{i}, A{i}\n" for i in range(layers))
    return (HEADER + f"diagram transformer({', '.join(params)}) -> [b t e] {{\n{body}  return X{layers}\n}}\n"
            + f"theorem fused_transformer: transformer {{\n{steps}  group b by 1\n}}\n")


if __name__ == "__main__":
    import sys

    print(model(int(sys.argv[1]) if len(sys.argv) > 1 else 2))
