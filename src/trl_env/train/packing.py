"""Prefix-shared, padding-free forwards: a batch's rows folded into a prefix trie, each unique token forwarded once.

Rows of one step repeat each other: the completions of a GRPO group share their prompt, the rows of an episode under
``history="deployed"`` share the conversation up to where the template rewrote it, every prompt may share a long
system prompt. ``pack_rows`` folds TRL's padded rows (``prompt_ids + completion_ids`` under their attention mask) into
a trie, lays each of its components out in DFS pre-order, positions = depth, and bins the components into as few
sequences as fit the longest one (padding only at a sequence's tail). The attention mask lets each token see exactly
its root-to-token path, so every token's hidden state equals its row's unpacked forward's; ``packed_logps`` runs the
forward once and gathers, for every row, the per-token log-probabilities TRL's loss reads, of the same shape and
value (zeros where TRL has zeros). Packing changes how the forward runs, never what is trained.

As in TRL's ``trl.experimental.async_grpo.packing.TreeRow``, a trie node is keyed on its token *and* the next one: the
trie forks one token before rows diverge, so every node predicts one next token and the model's fused LM head
(``add_fused_lm_head``, which TRL installs) scores it through plain per-position ``shift_labels``; a branch costs one
extra token per extra child. Unlike TRL's kernel (flash-attention 3, GPU only), the attention here is the model's own
SDPA or eager attention with a 4D ancestor mask: it runs on CPU and on GPU, at O(n^2) per sequence.

Models whose layers cannot take an arbitrary mask are refused (``unpackable_reason``): sliding-window or linear-
attention layers, attention sinks, an attention implementation that ignores 4D masks (flash-attention).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from trl_env.errors import ConfigError

__all__ = [
    "PACK_BELOW",
    "PackedRows",
    "PackingStats",
    "TokenTrie",
    "check_packable",
    "pack_rows",
    "packed_logps",
    "pair_weight_of",
    "packing_enabled",
    "packing_pays",
    "trainer_packed_logps",
    "row_token_lists",
    "unique_tokens",
    "unpackable_reason",
]

MASK_ATTENTION = ("sdpa", "eager")
"""Attention implementations that honour a custom 4D mask (flash-attention's ignores it)."""
DEFAULT_PAIR_WEIGHT = 1e-3
"""``pack_rows``'s attention pair cost against a position's when the model's shape is unknown."""
PACK_BELOW = 0.97
"""A forward runs packed only when its unique tokens are below this share of its row tokens: a trie that saves
(almost) nothing costs its build and layout for no fewer tokens, so those rows take the padded forward."""
SINK_MODELS = frozenset({"gpt_oss"})
"""Model types with attention sinks (a learnt logit every query attends to), which the ancestor mask cannot express."""


@dataclass(frozen=True)
class PackingStats:
    """What one packed forward saved: the rows' tokens against the tokens it forwarded."""

    row_tokens: int
    """Tokens of the rows as TRL hands them, without padding (what an unpacked, padding-free forward would run)."""
    unique_tokens: int
    """Trie nodes: the tokens forwarded once each (a branch adds one token per extra child)."""
    forwarded_positions: int
    """Positions the forward ran: sequences x their width, tail padding included."""
    padded_positions: int
    """Positions TRL's padded forward runs: rows x the batch's width."""

    @property
    def ratio(self) -> float:
        """Packing ratio: row tokens / forwarded tokens (unique tokens)."""
        return self.row_tokens / max(self.unique_tokens, 1)

    @property
    def padding_fraction(self) -> float:
        """Share of the packed forward's positions that are tail padding."""
        return 1.0 - self.unique_tokens / max(self.forwarded_positions, 1)


@dataclass(frozen=True)
class PackedRows:
    """One packed forward's inputs, and where each row's completion log-probabilities come out of it."""

    input_ids: torch.Tensor
    """(sequences, width) the unique tokens, each component in DFS pre-order; tail padding repeats the pad id."""
    position_ids: torch.Tensor
    """(sequences, width) each token's depth in the trie: its position in every row that holds it."""
    attention_mask: torch.Tensor
    """(sequences, width, width) bool, True where a query may see a key (its root-to-query path); or, when every
    sequence is one chain (rows sharing nothing), (sequences, width) 1 on tokens, 0 on tail padding: the model's own
    causal mask then does the same, faster."""
    shift_labels: torch.Tensor
    """(sequences, width) the next token each position predicts for some row's completion, -100 elsewhere."""
    index: torch.Tensor
    """(rows, logits_to_keep) flat position in (sequences x width) of each completion token's prediction."""
    valid: torch.Tensor
    """(rows, logits_to_keep) bool: where TRL's padded forward has a value (attention mask 1), else 0."""
    stats: PackingStats


def unpackable_reason(model: Any) -> str | None:
    """Why ``model``'s attention cannot take a packed forward, or ``None`` when it can.

    A packed forward needs every layer to attend through an arbitrary (ancestor) mask with positions from
    ``position_ids``: full attention only (no sliding window, no linear attention or state-space layers, no
    attention sinks), under an attention implementation that reads a 4D mask (SDPA or eager).
    """
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    name = type(model).__name__
    layer_types = getattr(config, "layer_types", None) or []
    other = sorted({str(t) for t in layer_types if t != "full_attention"})
    if other:
        return f"{name} has {', '.join(other)} layers (layer_types); packing needs full attention in every layer"
    if getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True):
        return f"{name} uses sliding-window attention (sliding_window={config.sliding_window})"
    if getattr(config, "model_type", None) in SINK_MODELS:
        return f"{name} has attention sinks"
    implementation = getattr(config, "_attn_implementation", None) or getattr(
        model.config, "_attn_implementation", None
    )
    if implementation not in MASK_ATTENTION:
        return (
            f"{name} runs attn_implementation={implementation!r}, which ignores a 4D mask; load it with "
            f"attn_implementation='sdpa' (or 'eager')"
        )
    return None


def check_packable(model: Any) -> None:
    """Refuse a model ``unpackable_reason`` names.

    Raises:
        ConfigError: naming the model class and why, and the fallback that trains it unpacked.
    """
    why = unpackable_reason(model)
    if why is not None:
        raise ConfigError(
            f"packing=True: {why}. Train it unpacked (packing=False), or pass packing='if_supported' to fall back to "
            "the padded forward for models that cannot take it."
        )


def row_token_lists(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[tuple[int, list[int]]] | None:
    """Each row's tokens (where the mask is 1) and the column of its first; ``None`` if a row's mask has a hole.

    TRL's rows are left-padded prompts then right-padded completions: each row's tokens are one contiguous run.
    """
    out = []
    ids, mask = input_ids.tolist(), attention_mask.tolist()
    for row, keep in zip(ids, mask, strict=True):
        cols = [c for c, m in enumerate(keep) if m]
        if cols and cols[-1] - cols[0] + 1 != len(cols):
            return None
        out.append((cols[0] if cols else 0, [row[c] for c in cols]))
    return out


class TokenTrie:
    """A growing prefix trie of rows, its nodes keyed as ``pack_rows`` keys them (a token and the next one).

    Its ``size`` is the tokens a packed forward of its rows runs (``unique_tokens``).
    """

    def __init__(self) -> None:
        self.roots: dict[tuple[int, int | None], Any] = {}
        self.size = 0

    def new_tokens(self, row: Sequence[int]) -> int:
        """The tokens ``row`` would add to the trie."""
        children, shared = self.roots, 0
        for key in zip(row, [*row[1:], None], strict=True):
            if key not in children:
                break
            children, shared = children[key], shared + 1
        return len(row) - shared

    def add(self, row: Sequence[int]) -> None:
        """Fold ``row`` into the trie."""
        children = self.roots
        for key in zip(row, [*row[1:], None], strict=True):
            if key not in children:
                children[key] = {}
                self.size += 1
            children = children[key]


def unique_tokens(rows: Sequence[Sequence[int]]) -> int:
    """Tokens a packed forward of ``rows`` runs: the nodes of their trie (keyed on each token and the next)."""
    trie = TokenTrie()
    for row in rows:
        trie.add(row)
    return trie.size


def packing_pays(row_tokens: int, unique: int) -> bool:
    """Whether packing rows of ``row_tokens`` tokens into ``unique`` trie nodes saves enough to run (``PACK_BELOW``)."""
    return unique < PACK_BELOW * row_tokens


def pack_rows(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    pad_id: int,
    *,
    pair_weight: float = DEFAULT_PAIR_WEIGHT,
) -> PackedRows | None:
    """Fold TRL's padded rows into a prefix trie laid out padding-free; ``None`` where they cannot be (a mask hole).

    ``input_ids`` / ``attention_mask``: (rows, width), TRL's ``prompt + completion`` columns; the last
    ``logits_to_keep`` columns are the completions, whose log-probabilities come back (``PackedRows.index``).
    The trie's components go into sequences of the width that costs least, ``pair_weight`` being the cost of one
    attention (query, key) pair against one position's (``pair_weight_of``).
    """
    rows = row_token_lists(input_ids, attention_mask)
    if rows is None:
        return None
    width = input_ids.size(1)
    first_kept = width - logits_to_keep
    # the trie: node -> token, children {(token, next token): node}; roots likewise
    tokens: list[int] = []
    children: list[dict[tuple[int, int | None], int]] = []
    roots: dict[tuple[int, int | None], int] = {}
    row_nodes: list[list[int]] = []
    for _, row in rows:
        level, nodes = roots, []
        for key in zip(row, [*row[1:], None], strict=True):
            node = level.get(key)
            if node is None:
                node = level[key] = len(tokens)
                tokens.append(key[0])
                children.append({})
            nodes.append(node)
            level = children[node]
        row_nodes.append(nodes)
    # each root's subtree (a component) in DFS pre-order: order, depth, subtree end
    components: list[list[tuple[int, int]]] = []  # [(node, depth)] in pre-order
    ends: list[list[int]] = []  # per component, per pre-order index: index after its subtree
    for root in roots.values():
        order: list[tuple[int, int]] = []
        parent_slot: list[int] = []
        stack: list[tuple[int, int, int]] = [(root, 0, -1)]
        while stack:
            node, depth, parent = stack.pop()
            order.append((node, depth))
            parent_slot.append(parent)
            slot = len(order) - 1
            stack.extend((child, depth + 1, slot) for child in reversed(children[node].values()))
        subtree_end = list(range(1, len(order) + 1))
        for slot in range(len(order) - 1, 0, -1):  # children come after their parent: fold subtree ends upwards
            subtree_end[parent_slot[slot]] = max(subtree_end[parent_slot[slot]], subtree_end[slot])
        components.append(order)
        ends.append(subtree_end)
    sizes = [len(c) for c in components]
    if all(e == len(c) for c, end in zip(components, ends, strict=True) for e in end):
        # nothing shared: one chain per sequence, the model's own causal kernel (a dense mask would cost more)
        bins, seq_width = [[k] for k in range(len(components))], max(sizes, default=1)
    else:
        bins, seq_width = _bin_components(sizes, pair_weight)
    loads = [sum(len(components[k]) for k in members) for members in bins]
    sequences = len(bins)
    packed_ids = torch.full((sequences, seq_width), pad_id, dtype=torch.long)
    positions = torch.zeros((sequences, seq_width), dtype=torch.long)
    # ancestor intervals: a key k is seen by the query q iff start[k] <= q < end[k] (same sequence)
    start = torch.arange(seq_width).expand(sequences, seq_width).clone()
    end = start + 1  # tail padding sees itself only (a fully masked row would give NaN)
    where = [0] * len(tokens)  # node -> flat position
    chains = True
    for b, members in enumerate(bins):
        offset = 0
        for k in members:
            order = components[k]
            chains = chains and all(e == len(order) for e in ends[k]) and len(members) == 1
            for slot, (node, depth) in enumerate(order):
                packed_ids[b, offset + slot] = tokens[node]
                positions[b, offset + slot] = depth
                end[b, offset + slot] = offset + ends[k][slot]
                where[node] = b * seq_width + offset + slot
            offset += len(order)
    labels = torch.full((sequences * seq_width,), -100, dtype=torch.long)
    index = torch.zeros((len(rows), logits_to_keep), dtype=torch.long)
    valid = torch.zeros((len(rows), logits_to_keep), dtype=torch.bool)
    for r, ((first, row), nodes) in enumerate(zip(rows, row_nodes, strict=True)):
        for p in range(1, len(row)):
            column = first + p - first_kept
            if column < 0:
                continue
            flat = where[nodes[p - 1]]
            labels[flat] = row[p]
            index[r, column] = flat
            valid[r, column] = True
    if chains:
        mask = (torch.arange(seq_width).unsqueeze(0) < torch.tensor(loads).unsqueeze(1)).long()
    else:
        q = torch.arange(seq_width).view(1, seq_width, 1)
        mask = (start.unsqueeze(1) <= q) & (q < end.unsqueeze(1))  # (sequences, query, key)
    stats = PackingStats(
        row_tokens=sum(len(row) for _, row in rows),
        unique_tokens=len(tokens),
        forwarded_positions=sequences * seq_width,
        padded_positions=input_ids.numel(),
    )
    return PackedRows(packed_ids, positions, mask, labels.view(sequences, seq_width), index, valid, stats)


def pair_weight_of(model: Any) -> float:
    """The cost of one attention (query, key) pair relative to one position's linear layers and LM head (flops).

    A dense-mask attention pays for every pair of a sequence, so wide sequences cost more than the tokens they hold;
    ``pack_rows`` weighs the two with this ratio.
    """
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    try:
        hidden, layers = int(config.hidden_size), int(config.num_hidden_layers)
        heads = int(config.num_attention_heads)
        head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        ffn = int(getattr(config, "intermediate_size", None) or 4 * hidden)
        vocab = int(config.vocab_size)
    except (AttributeError, TypeError):
        return DEFAULT_PAIR_WEIGHT
    per_layer = hidden * head_dim * (2 * heads + 2 * kv_heads) + 3 * hidden * ffn
    per_position = layers * per_layer + hidden * vocab
    return 2 * layers * heads * head_dim / per_position


def _bin_components(sizes: list[int], pair_weight: float) -> tuple[list[list[int]], int]:
    """Components (by size) in sequences, first fit longest first, at the width of least cost; and that width.

    Cost: positions (sequences x width) plus ``pair_weight`` x attention pairs (sequences x width^2). Widths tried:
    the longest component's, growing by a quarter up to all components in one sequence.
    """
    longest, total = max(sizes, default=1), max(sum(sizes), 1)
    order = sorted(range(len(sizes)), key=lambda k: -sizes[k])
    best: tuple[float, list[list[int]], int] | None = None
    width = longest
    while True:
        bins: list[list[int]] = []
        loads: list[int] = []
        for k in order:
            for b, load in enumerate(loads):
                if load + sizes[k] <= width:
                    bins[b].append(k)
                    loads[b] += sizes[k]
                    break
            else:
                bins.append([k])
                loads.append(sizes[k])
        cost = len(bins) * width * (1 + pair_weight * width)
        if best is None or cost < best[0]:
            best = (cost, bins, width)
        if width >= total:
            return best[1], best[2]
        width = min(total, max(width + 1, width * 5 // 4))


def packed_logps(
    model: Any, packed: PackedRows, *, compute_entropy: bool = False, attention: str = "sdpa"
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probabilities (and entropies) of each row's completion tokens, from one packed forward.

    ``model`` is the policy as TRL calls it (its forward patched by TRL's ``add_fused_lm_head``, so the LM head runs
    in chunks, at TRL's temperature). Returns tensors of shape (rows, logits_to_keep), equal to what
    ``GRPOTrainer._get_per_token_logps_and_entropies`` returns for the padded rows: zeros where those are zeros.
    ``attention`` is the model's attention implementation: ``"eager"`` takes an additive mask, SDPA a boolean one.
    """
    device = _device_of(model)
    kwargs: dict[str, Any] = {"position_ids": packed.position_ids.to(device)}
    if packed.attention_mask.ndim == 2:  # one chain per sequence: the model's own causal mask
        kwargs["attention_mask"] = packed.attention_mask.to(device)
    else:
        mask = packed.attention_mask.unsqueeze(1).to(device)
        if attention == "eager":
            dtype = _dtype_of(model)
            mask = torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill(~mask, torch.finfo(dtype).min)
        kwargs["attention_mask"] = mask
    outputs = model(
        input_ids=packed.input_ids.to(device),
        shift_labels=packed.shift_labels.to(device),
        fused_lm_head=True,
        **kwargs,
    )
    index, valid = packed.index.to(device), packed.valid.to(device)

    def gather(values: torch.Tensor) -> torch.Tensor:
        return values.reshape(-1)[index].masked_fill(~valid, 0.0)

    entropies = gather(outputs.entropy) if compute_entropy else None
    return gather(outputs.log_probs), entropies


def _device_of(model: Any) -> torch.device:
    """The device of the model's first parameter (its input embeddings')."""
    return next(model.parameters()).device  # type: ignore[no-any-return]


def _dtype_of(model: Any) -> torch.dtype:
    """The dtype of the model's first floating-point parameter."""
    return next(p.dtype for p in model.parameters() if p.is_floating_point())  # type: ignore[no-any-return]


PACKING_MODES = (False, True, "if_supported")
"""``EpisodeGRPOTrainer(packing=...)``: off, on (an unpackable model refused), on where the model can take it."""


def packing_enabled(model: Any, packing: bool | str) -> bool:
    """Whether a trainer with ``packing`` packs ``model``'s forwards.

    Raises:
        ConfigError: for a value outside ``PACKING_MODES``, or ``packing=True`` with a model ``unpackable_reason``
            names (``"if_supported"`` then warns and trains unpacked).
    """
    if packing not in PACKING_MODES or not isinstance(packing, (bool, str)):
        raise ConfigError(f"packing={packing!r}: expected one of {PACKING_MODES}.")
    if packing is False:
        return False
    if packing is True:
        check_packable(model)
        return True
    why = unpackable_reason(model)
    if why is not None:
        warnings.warn(f"trl_env: packing='if_supported': {why}; training with padded rows.", stacklevel=3)
        return False
    return True


def trainer_packed_logps(
    trainer: Any,
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    batch_size: int | None = None,
    compute_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """What ``GRPOTrainer._get_per_token_logps_and_entropies`` returns for text rows, from packed forwards.

    In chunks of ``batch_size`` rows as TRL's (each chunk one packed forward), under the trainer's autocast. A forward
    with gradients (the loss's) logs ``packing/ratio`` (row tokens / forwarded tokens) and
    ``packing/padding_fraction`` (padding / forwarded positions) under the trainer's metrics. ``None`` when a
    row's mask is not one contiguous run, a row's first token is a completion token (nothing predicts it), or the
    rows' trie saves (almost) nothing (``packing_pays``; the ratio is still logged): the caller then runs TRL's padded
    forward.
    """
    from trl_env.train.trl_internals import tokenizer_of

    pad_id = tokenizer_of(trainer).pad_token_id
    pad_id = 0 if pad_id is None else int(pad_id)
    size = batch_size or input_ids.size(0)
    weight = pair_weight_of(model)
    attention = str(getattr(getattr(model, "config", None), "_attn_implementation", "sdpa"))
    if logits_to_keep >= input_ids.size(1):
        return None
    chunks = []
    for start in range(0, input_ids.size(0), size):
        mask = attention_mask[start : start + size]
        if bool((mask[:, -logits_to_keep - 1] == 0).logical_and(mask[:, -logits_to_keep] == 1).any()):
            return None  # a row without a prompt: TRL's forward predicts its first token from padding
        chunks.append((input_ids[start : start + size], mask))
    rows = [row_token_lists(ids, mask) for ids, mask in chunks]
    if any(r is None for r in rows):
        return None
    row_tokens = sum(len(row) for chunk in rows for _, row in chunk or [])
    unique = sum(unique_tokens([row for _, row in chunk or []]) for chunk in rows)
    if not packing_pays(row_tokens, unique):  # the trie saves (almost) nothing: TRL's padded forward
        _log_packing(trainer, model, row_tokens, unique, positions=input_ids.numel(), tokens=row_tokens)
        return None
    packs = []
    for ids, mask in chunks:
        packed = pack_rows(ids, mask, logits_to_keep, pad_id, pair_weight=weight)
        if packed is None:
            return None
        packs.append(packed)
    logps, entropies = [], []
    for packed in packs:
        with trainer.accelerator.autocast():
            values, entropy = packed_logps(model, packed, compute_entropy=compute_entropy, attention=attention)
        logps.append(values)
        entropies.append(entropy)
    positions = sum(p.stats.forwarded_positions for p in packs)
    _log_packing(trainer, model, row_tokens, unique, positions=positions, tokens=unique)
    return torch.cat(logps), torch.cat(entropies) if compute_entropy else None  # type: ignore[arg-type]


def _log_packing(trainer: Any, model: Any, row_tokens: int, unique: int, *, positions: int, tokens: int) -> None:
    """Log ``packing/ratio`` and ``packing/padding_fraction`` for a forward with gradients (the loss's).

    The ratio is row tokens / unique tokens; the padding fraction the share of the forward's ``positions`` that hold
    none of its ``tokens``.
    """
    from trl_env.train.trl_internals import metric_lists

    metrics = metric_lists(trainer)
    if not torch.is_grad_enabled() or metrics is None:
        return
    logged = metrics["train" if model.training else "eval"]
    logged["packing/ratio"].append(row_tokens / max(unique, 1))
    logged["packing/padding_fraction"].append(1.0 - tokens / max(positions, 1))
