"""MLP logit lens: which numbers an MLP reads from the residual and which it writes (Zhang et al. 2024, 4.2).

Background
    An MLP reads the residual stream at END and adds its output back to it. Projecting those vectors onto
    the unembedding rows of number tokens shows what the MLP receives and what it produces (Geva et al.
    2022): if cos(MLP_in, W_U[A]) and cos(MLP_in, W_U[B]) rise in the layers after the operand heads, the
    operands have been written into the residual the MLP reads (paper Figure 6a); if the MLP's own update
    points at W_U[C] more than at the other numbers, the MLP computes the answer (Figure 6b). Ranking all
    number tokens in the update's logits shows which numbers each layer writes (Figure 6c).

Definitions (per layer l, at END; METHODS.md section 4)
    MLP_in            the residual the MLP reads: the input of its pre-norm (`EndStates.mlp_read`). In a
                      sequential block that is block input + attention contribution; in a GPT-NeoX/Pythia
                      parallel block it is the block input itself (attention and MLP read the same vector).
    MLP_out - MLP_in  the MLP's contribution to the residual ("update"): the MLP module output, passed through
                      the post-MLP norm where the family has one (Gemma 2/3). In a sequential block this is
                      exactly (residual after the MLP) - (residual before it). In a parallel block the
                      residual after the block also holds the attention output; the update is the MLP's term
                      alone, so that it measures this MLP and nothing else.
    W_U[t]            row t of the raw unembedding weight (`model.get_output_embeddings().weight`), with no
                      centering, no final norm and no bias: the direction that raises token t's logit.
    A, B, C           the first token of operand A / operand B / the answer, each as it follows the text
                      before it in the prompt (`operand_token_ids`; C = `TokenizedPairs.answer_ids`).
    numbers           the candidate number tokens: the first tokens of "0".."max_number" in the same
                      place, deduplicated. With a one-digit-per-token tokenizer (Llama 2, SmolLM2) these are
                      the 10 digit tokens, whatever max_number is.

Formulas; shapes [layer, batch] unless said
    cos_in_A[l, i]          = cos(MLP_in[l, i], W_U[A_i])
    cos_in_A_wrong[l, i]    = mean over n in numbers_A, n != A_i, of cos(MLP_in[l, i], W_U[n])
    cos_in_B[_wrong]        likewise with B
    cos_update_C[l, i]      = cos(update[l, i], W_U[C_i])
    cos_update_C_wrong      = mean over n in numbers_C, n != C_i, of cos(update[l, i], W_U[n])
    with cos(x, w) = x . w / (|x| |w|); it is scale-invariant, so raw residual vectors are used.

    update_ranks, for one prompt: logits[l, :] = unembed(final_norm(update[l]))   [layer, d_vocab]
        rank[l, k] = #{tokens t : logits[l, t] > logits[l, numbers[k]]}            [layer, n_numbers]
    (0 = top of the whole vocabulary). The model's own final norm module and unembedding (with its bias if
    any) are applied to the update as if it were the whole residual. Gemma 2's final soft-cap is monotone so
    it cannot change a rank; it is left out so that tanh saturation cannot create ties.

Usage
    >>> states = collect_end_states(view, ids, mask, end)            # patching.states
    >>> a_ids, b_ids = operand_token_ids(tokenizer, pairs)
    >>> numbers = number_token_ids(tokenizer, pairs, max_number=9)   # {"A": [n], "B": [n], "C": [n]}
    >>> cos = mlp_cosines(view, states, a_ids, b_ids, answer_ids, numbers)
    >>> cos["cos_update_C"].mean(1)                                   # [layer], averaged over prompts
    >>> update_ranks(view, states, numbers["C"], prompt=0)          # [layer, n_numbers]

References: Zhang et al., ICML 2024, section 4.2 and Figure 6; Geva et al., EMNLP 2022 (FFN updates
promote vocabulary tokens); nostalgebraist 2020 (logit lens); METHODS.md section 4.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from arithmech.data import PromptPair, answer_token_id
from arithmech.errors import DataError
from arithmech.models.view import ModelView
from arithmech.patching.states import EndStates

COSINE_COLUMNS: tuple[str, ...] = (
    "cos_in_A",
    "cos_in_A_wrong",
    "cos_in_B",
    "cos_in_B_wrong",
    "cos_update_C",
    "cos_update_C_wrong",
)
ROLES: tuple[str, ...] = ("A", "B", "C")
_EPS = 1e-12


# -- which tokens --
def _operand_context(pair: PromptPair, role: str, index: int) -> tuple[str, str]:
    """(text before operand `role` in the reference, the operand's text) of one prompt pair.

    The operand's place is its span when the pair has one; otherwise its last occurrence in the reference
    (for A: the last one before B's), which is right for prompts that end with the query.
    """
    field = role.lower()
    text = getattr(pair, field) or (pair.span_text(role) if role in pair.spans else None)
    if not text:
        raise DataError(
            f"prompt {index} ({pair.reference[-30:]!r}) does not say its operands; the MLP logit lens needs "
            "the fields a and b (operand texts) in every prompt, or spans with A and B; add them and rerun "
            "identify"
        )
    if role in pair.spans:
        return pair.reference[: pair.spans[role][0]], text
    if role == "A":
        b_text = pair.b or (pair.span_text("B") if "B" in pair.spans else "")
        b_start = pair.spans["B"][0] if "B" in pair.spans else pair.reference.rfind(b_text)
        start = pair.reference.rfind(text, 0, b_start if b_start > 0 else len(pair.reference))
    else:
        start = pair.reference.rfind(text)
    if start < 0:
        raise DataError(
            f"operand {field}={text!r} of prompt {index} does not occur in its reference "
            f"{pair.reference[-30:]!r}; fix the a/b fields"
        )
    return pair.reference[:start], text


def _first_token(tokenizer: Any, context: str, text: str, what: str) -> int:
    """`answer_token_id`, with an error that says which token could not be placed."""
    try:
        return answer_token_id(tokenizer, context, text)
    except DataError:
        raise DataError(
            f"the {what} ({text!r} after {context[-20:]!r}) does not start a new token, so it has no token "
            "of its own to compare with; put a space or symbol before the operands in the prompts"
        ) from None


def operand_token_ids(tokenizer: Any, pairs: Sequence[PromptPair]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids of operands A and B, [batch] each: the first token of each operand as it follows the text
    before it (the rule `answer_token_id` uses for C), so a tokenizer that merges the space into the number
    gives the merged token, as the model saw it."""
    ids: dict[str, list[int]] = {"A": [], "B": []}
    for index, pair in enumerate(pairs):
        for role in ("A", "B"):
            context, text = _operand_context(pair, role, index)
            ids[role].append(_first_token(tokenizer, context, text, f"operand {role} of prompt {index}"))
    return torch.tensor(ids["A"], dtype=torch.long), torch.tensor(ids["B"], dtype=torch.long)


def largest_number(pairs: Sequence[PromptPair]) -> int:
    """The largest whole number among the operands and answers (at least 9), for the candidate range."""
    values = [9]
    for pair in pairs:
        for text in (pair.a, pair.b, pair.answer):
            if text and re.fullmatch(r"[0-9]+", text.strip()):
                values.append(int(text.strip()))
    return max(values)


def number_token_ids(tokenizer: Any, pairs: Sequence[PromptPair], max_number: int) -> dict[str, torch.Tensor]:
    """Candidate number tokens per role {"A", "B", "C"} -> [n_numbers] ids.

    For each prompt, the first token of str(n), n = 0..max_number, as it follows the text before the role's
    token (before A, before B, or the whole prompt for C); deduplicated over numbers and prompts, in the
    order of the smallest number that gives each token.
    """
    contexts: dict[str, set[str]] = {role: set() for role in ROLES}
    for index, pair in enumerate(pairs):
        contexts["A"].add(_operand_context(pair, "A", index)[0])
        contexts["B"].add(_operand_context(pair, "B", index)[0])
        contexts["C"].add(pair.reference)
    out = {}
    for role in ROLES:
        seen: dict[int, int] = {}
        for context in sorted(contexts[role]):
            for n in range(max_number + 1):
                seen.setdefault(_first_token(tokenizer, context, str(n), f"number {n} in place of {role}"), n)
        ordered = sorted(seen, key=lambda token: (seen[token], token))
        out[role] = torch.tensor(ordered, dtype=torch.long)
    return out


# -- cosines --
@torch.no_grad()
def mlp_update(view: ModelView, states: EndStates) -> torch.Tensor:
    """MLP_out - MLP_in: what each layer's MLP adds to the residual at END, [layer, batch, d_model]."""
    rows = []
    for layer in range(view.dims.n_layers):
        norm = view.mlp_out_norm(layer)
        out = states.mlp_out[layer]  # [batch, d_model]
        rows.append(norm(out) if norm is not None else out)
    return torch.stack(rows)  # [layer, batch, d_model]


def _unit(x: torch.Tensor) -> torch.Tensor:
    x = x.float()
    return x / x.norm(dim=-1, keepdim=True).clamp_min(_EPS)


def target_cosines(
    x: torch.Tensor, w_u: torch.Tensor, target_ids: torch.Tensor, candidate_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos(x, W_U[target]) and the mean cos(x, W_U[n]) over candidates n != target.

    x: [layer, batch, d_model], w_u: [d_vocab, d_model], target_ids: [batch], candidate_ids: [n_numbers]
    -> ([layer, batch], [layer, batch]); the second is nan for a prompt with no other candidate.
    """
    x_unit = _unit(x.to(w_u.device))  # [layer, batch, d_model]
    target_rows = _unit(w_u[target_ids.to(w_u.device)])  # [batch, d_model]
    correct = (x_unit * target_rows).sum(-1)  # [layer, batch]
    cand = candidate_ids.to(w_u.device)
    cand_rows = _unit(w_u[cand])  # [n_numbers, d_model]
    all_cos = torch.einsum("lbd,nd->lbn", x_unit, cand_rows)  # [layer, batch, n_numbers]
    wrong = cand[None, :] != target_ids.to(w_u.device)[:, None]  # [batch, n_numbers]
    count = wrong.sum(-1).float()  # [batch]
    wrong_mean = (all_cos * wrong).sum(-1) / count  # [layer, batch]; 0/0 = nan where no wrong candidate
    return correct, wrong_mean


@torch.no_grad()
def mlp_cosines(
    view: ModelView,
    states: EndStates,
    a_ids: torch.Tensor,
    b_ids: torch.Tensor,
    c_ids: torch.Tensor,
    candidate_ids: torch.Tensor | Mapping[str, torch.Tensor],
) -> dict[str, torch.Tensor]:
    """Per-prompt cosines of Figure 6a/6b, one [layer, batch] float32 tensor per name in COSINE_COLUMNS.

    a_ids, b_ids, c_ids: [batch]; candidate_ids: [n_numbers] used for all three roles, or {"A", "B", "C"}
    -> [n_numbers] (see `number_token_ids`). Average over the batch dimension for the paper's curves.
    """
    w_u = view.unembed.weight.detach()  # [d_vocab, d_model]
    if isinstance(candidate_ids, torch.Tensor):
        candidates = {role: candidate_ids for role in ROLES}
    else:
        candidates = dict(candidate_ids)
    update = mlp_update(view, states)  # [layer, batch, d_model]
    out: dict[str, torch.Tensor] = {}
    for role, x, ids in (("A", states.mlp_read, a_ids), ("B", states.mlp_read, b_ids), ("C", update, c_ids)):
        name = "cos_update_C" if role == "C" else f"cos_in_{role}"
        out[name], out[f"{name}_wrong"] = target_cosines(x, w_u, ids, candidates[role])
    return {name: out[name].cpu() for name in COSINE_COLUMNS}


# -- ranks --
@torch.no_grad()
def update_logits(view: ModelView, update: torch.Tensor) -> torch.Tensor:
    """unembed(final_norm(update)) without soft-cap, read out in float32: [..., d_model] -> [..., d_vocab]."""
    return view.vocab_logits(update, softcap=False).float()


@torch.no_grad()
def update_ranks(
    view: ModelView, states: EndStates, number_ids: torch.Tensor, prompt: int = 0
) -> torch.Tensor:
    """Rank (0 = top) of each number token in the whole vocabulary, in the logits of each layer's MLP update
    for one prompt (Figure 6c): [layer, n_numbers] long. `prompt` indexes the batch of `states`."""
    update = mlp_update(view, states)[:, prompt]  # [layer, d_model]
    logits = update_logits(view, update)  # [layer, d_vocab]
    ids = number_ids.to(logits.device)
    target = logits[:, ids]  # [layer, n_numbers]
    ranks = torch.stack([(logits > target[:, k : k + 1]).sum(-1) for k in range(len(ids))], dim=1)
    return ranks.cpu()  # [layer, n_numbers]
