"""Pipeline "eager", "the cloud never idles": both sides' state objects (no I/O, no clocks).

Why one file: the device's rules (adopt, branch, promote) and the cloud's (admit, promote,
preempt) must decide the same things from the same tokens, and the exactness argument below
covers both; split, each half would be read without the other.

The async pipeline (PicoSpec) leaves the cloud idle from each rejection until the device's
next drafts arrive: one round trip plus a draft step. Here the cloud fills every such gap by
decoding on its own from its last committed token, and streams those tokens down as
committed. Words used here (as in drafter.py and verifier.py), and:

- *AR step*: the cloud samples the token at its frontier from the target law with the
  generator the verifier would use there, tandem.sampling.seeds.sample_at(..., seed, "verify", position).
  Right after a verification the row it needs is already computed (the pass's last row, or the
  residual token is pending), so the first step after a fully accepted block is free: it plays
  the bonus token's role (verify() draws no bonus in this mode).
- *chain*: the drafts of one device epoch, in position order. The device starts a new chain
  (epoch + 1) whenever a token the cloud committed differs from its draft at that position
  (a rejection verdict, or an AR token it did not draft); it then drafts from its frontier.
- *adopt*: the device's rule for every committed token that comes down (AR token, accepted
  draft, residual): a token equal to the device's draft there commits that draft and keeps the
  drafts after it in flight (they were conditioned on the right prefix); a different token
  voids every draft (new epoch), is committed, and drafting restarts after it.
- *admit*: the cloud's rule for a request. A request of an older epoch, or of the current
  epoch once that chain is *dead* (one of its drafts differs from a committed token), is stale.
  A request of a newer epoch starts a new chain. Drafts at positions the cloud has already
  committed are checked against the committed tokens: the matching prefix is skipped, a
  mismatch kills the chain (the device hears of it from the token already streamed down).
  The drafts left, starting at the cloud's frontier, are verified in one forward pass.
- *interrupt* (device): a committed token that differs from a draft the device holds kills
  its chain, so the device's reader stops the draft step in flight at once (the draft model's
  cancel event, as PicoSpec's interrupt on a rejection verdict) instead of finishing a step
  whose draft adoption would void: the new chain starts up to a draft step sooner. Timing only.
- *free step first*: the first AR step after the prefill or after a fully accepted pass
  needs no forward pass (its row is there), so the cloud takes it before the requests that
  wait, and streams that token down at once: it reaches the device a pass earlier than the
  verdict on the draft at its position would (the first token of every generation ~80 ms
  sooner in the emulated paper regime), a draft that differs from it dies without a pass,
  and one equal to it is skipped by the content check, so the pass that follows feeds the
  same tokens as it would have. Timing only.
- *preempt*: a request that arrives during an AR step stops it (the cancel event) only when
  that pays: the request is not stale (nor dead on arrival: no draft differs from a token
  already committed), holds drafts beyond the position being decoded, and the step has run
  less than `planner.preempt_threshold` (t_ar - per-token cost when every draft matches:
  stopping throws away the elapsed time, finishing costs the rest but commits a token and
  shortens the verification by one; less by the chance, the cloud's running estimate alpha,
  that the draft at the step's position differs, when finishing would have told the device
  sooner). Timing only: it never changes what a position draws.
- *branch* (`branch_below` > 0): where the draft model's own law (softmax of the row at
  temperature 1) puts less than `branch_below` on its top token, the device, right after
  drafting position t and sending it, drafts `branch_len` tokens after b, the most likely
  token other than its draft d_t, and sends them as a request of epoch e + 1 whose one fixed
  token is b at t. If chain e dies at t with b committed there (a residual or an AR token),
  both sides take the branch as chain e + 1 (*promote*): its drafts are at the cloud already,
  so the rejection costs no round trip; else the branch is stale. The drafts are those a new
  chain after b would draft (same law, same generator ("draft", p)): timing only. The device
  counts how its drafts fare (`confidence`: matched or not, unsure or not, the committed token
  its branch token or not), and a controller may turn branching off for a generation
  (`branching`, device.py) from earlier generations' counts: timing only as well.

Exactness (the output law is the target's). The cloud commits each position t exactly once,
by (a) an AR step: x_t ~ target(. | x_<t) drawn with generator ("verify", t); or (b) verifying
the draft d_t that the device sampled from the law q_t it transmitted, with generator
("draft", t), against target(. | x_<t) with generator ("verify", t) (accept with
min(1, target/q_t), else the residual). A content-skipped draft commits nothing: its position
was committed by (a) or (b) before. Both branches give x_t | x_<t ~ target(. | x_<t) as long as
the choice between them is independent of the two generators at t: the speculative sampling
lemma holds for any proposal law q_t, including one computed on a prefix the cloud does not
hold (such drafts are in dead chains and never verified anyway). The choice at t depends on
what arrived when: on the timing of forward passes and messages (which depends on token
counts, never on token values), on everything at positions < t, and on the laws q_t (their
size under a bit budget), never on the values drawn at t: the draft at t is made with the
same generator in every chain, the cloud's AR step at t is preempted before it samples (the
choice to preempt reads only drafts and committed tokens before t and the acceptance seen
there, the estimate alpha), and the position's "verify" generator is used once. A branch
changes no draw either: whether one is drafted depends on the law at t (not on a value drawn
there), its size is fixed, it is sent after d_t and admitted after t is committed, and whether
it is promoted depends on the token committed at t, an earlier position than any it covers.
The chain
rule over t then gives the target's joint law; at temperature 0 both branches are the
target's argmax, so the output is its greedy decoding. tests/exactness/test_eager_law.py
enumerates the law for fixed schedules of the state objects and checks the real runs by
chi-square.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from tandem.errors import TandemError
from tandem.models.base import Cancelled
from tandem.protocols.spec.drafter import Chunk, Drafter, DraftItem, Outcome
from tandem.protocols.spec.planner import preempt_threshold
from tandem.protocols.spec.verifier import Request, Result, Verifier
from tandem.sampling.seeds import sample_at
from tandem.sampling.warp import warp

ALPHA_WEIGHT = 0.1  # weight of each draft's outcome in the cloud's alpha estimate


@dataclass(frozen=True)
class Admission:
    """What `EagerVerifier.admit` made of one request."""

    verify: Request | None  # the drafts left to verify from the frontier (None: nothing)
    skipped: int  # drafts at positions already committed that matched them
    stale: bool  # the request's chain is old or dead, or a draft mismatched a committed token


class EagerVerifier(Verifier):
    """Cloud state for one eager generation: a Verifier plus AR steps and chain tracking."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.config.pipeline != "eager":
            raise TandemError("spec: EagerVerifier needs pipeline eager")
        self.chain_epoch = 0
        self.chain_dead = False
        self.died_at: int | None = None  # the position where the current chain died
        self.branches = 0  # branches promoted (*branch*)
        self.ar_steps = 0  # tokens committed by AR steps
        self.last_step_free = False  # the last AR step ran no forward pass (its row was there)
        self.skipped = 0  # drafts skipped by the content check
        self._ar_s: list[float] = []  # recent AR step times
        self._per_token_s: list[float] = []  # recent verify passes' cost per extra token
        self.alpha = 1.0  # estimated chance a draft matches the committed token (*preempt*)

    @property
    def done(self) -> bool:
        if self.frontier >= self.config.max_new_tokens:
            return True
        return self.eos_id is not None and self.eos_id in self.committed

    @property
    def step_free(self) -> bool:
        """Whether the next AR step needs no forward pass: its row is there (after the prefill
        or a fully accepted pass), so the cloud takes it before any waiting request (*free
        step first*)."""
        return not self.done and self.ctx.row_ready

    def ar_step(self) -> int | None:
        """Commit the token at the frontier from the target law (one forward pass unless the
        row is already there; preemptible through `cancel`, nothing changes if cancelled)."""
        if self.done:
            return None
        passes = self.ctx.forward_passes
        row = self.ctx.logits(cancel=self.cancel)[-1]  # [vocab]
        self.last_step_free = self.ctx.forward_passes == passes  # the row was already there
        if self.config.temperature == 0:  # warp's one-hot row, whose draw is its argmax
            token = int(row.argmax())
        else:
            target_probs = warp(row, **self.config.sampling())
            token = sample_at(target_probs, self.config.seed, "verify", self.frontier)
        self.committed.append(token)
        self.ctx.append([token])
        self.ar_steps += 1
        return token

    def note_pass(self, tokens: int, seconds: float) -> None:
        """A forward pass over `tokens` new tokens took `seconds` (AR step: 1)."""
        if tokens <= 1:
            self._ar_s = [*self._ar_s[-15:], seconds]
        elif self._ar_s:
            t_ar = sum(self._ar_s) / len(self._ar_s)
            self._per_token_s = [
                *self._per_token_s[-15:],
                max(0.0, (seconds - t_ar) / (tokens - 1)),
            ]

    def worth_preempting(
        self, epoch: int, position: int, tokens: Sequence[int], elapsed_s: float, fixed: int = 0
    ) -> bool:
        """Whether a request (epoch, drafts `tokens` from `position`) that arrives `elapsed_s`
        into the AR step at the frontier should stop it (*preempt*). Not when `admit` would
        find it stale: an old epoch, a dead chain, or a draft that differs from a token
        already committed (until 2026-11-28 such a request stopped the step all the same; in
        one emulated generation at 0.75 / RTT 100 the content check took the AR steps stopped
        from 32 of 56 to 27, the threshold at alpha then to 13 of 69)."""
        if epoch < self.chain_epoch or (epoch == self.chain_epoch and self.chain_dead):
            return False
        if fixed and not self._promotable(epoch, position, tokens[:fixed]):
            return False
        frontier = self.frontier
        if position + len(tokens) <= frontier + 1:
            return False  # nothing beyond the token being decoded: finishing it is free
        if self._content_check(position, tokens, frontier)[1]:
            return False  # dead on arrival: admit will drop it
        if not self._ar_s or not self._per_token_s:
            return True
        t_ar = sum(self._ar_s) / len(self._ar_s)
        per_token = sum(self._per_token_s) / len(self._per_token_s)
        live = position + len(tokens) - frontier  # drafts the pass would take
        return elapsed_s < preempt_threshold(t_ar, per_token, self.alpha, live)

    def _content_check(
        self, position: int, tokens: Sequence[int], frontier: int
    ) -> tuple[int, bool]:
        """(drafts from `position` at positions below `frontier` that equal the committed
        tokens, whether the one after them differs: then the chain is dead)."""
        below = tokens[: max(0, frontier - position)]
        for offset, token in enumerate(below):
            if self.committed[position + offset] != int(token):
                return offset, True
        return len(below), False

    def _note_drafts(self, matched: int, mismatched: int) -> None:
        """Drafts found equal to / different from the committed token (the alpha estimate)."""
        for outcome in [1.0] * matched + [0.0] * mismatched:
            self.alpha += ALPHA_WEIGHT * (outcome - self.alpha)

    def _promotable(self, epoch: int, position: int, fixed: Sequence[int]) -> bool:
        """Whether a branch (epoch, one fixed token at `position`) is the next chain: the
        current chain died at `position` with that token committed there (*branch*)."""
        return (
            len(fixed) == 1
            and epoch == self.chain_epoch + 1
            and self.chain_dead
            and self.died_at == position < self.frontier
            and self.committed[position] == int(fixed[0])
        )

    def _died(self, position: int) -> None:
        self.chain_dead, self.died_at = True, position

    def admit(self, request: Request) -> Admission:
        """Chain and content checks (module docstring); no model work."""
        if request.fixed:  # a branch: the next chain if the current one died at its token
            if len(request.fixed) != 1:
                raise TandemError("spec: an eager request carries at most one fixed token")
            if not self._promotable(request.epoch, request.position, request.fixed):
                return Admission(verify=None, skipped=0, stale=True)
            self.chain_epoch, self.chain_dead, self.died_at = request.epoch, False, None
            self.branches += 1
            request = replace(request, position=request.position + 1, fixed=())
        if request.epoch < self.chain_epoch or (
            request.epoch == self.chain_epoch and self.chain_dead
        ):
            return Admission(verify=None, skipped=0, stale=True)
        if request.epoch > self.chain_epoch:
            self.chain_epoch, self.chain_dead, self.died_at = request.epoch, False, None
        if self.done:
            return Admission(verify=None, skipped=0, stale=False)
        if request.position > self.frontier:
            raise TandemError(
                f"spec: eager request at position {request.position} beyond the cloud's "
                f"frontier {self.frontier}"
            )
        skip, dead = self._content_check(request.position, request.drafts, self.frontier)
        self.skipped += skip
        self._note_drafts(skip, int(dead))
        if dead:
            self._died(request.position + skip)
            return Admission(verify=None, skipped=skip, stale=True)
        rest = request.drafts[skip:]
        if not rest:
            return Admission(verify=None, skipped=skip, stale=False)
        plan = replace(
            request,
            epoch=self.epoch,
            position=self.frontier,
            drafts=rest,
            draft_rows=request.draft_rows[skip:],
            final=False,  # the AR step after the pass takes the bonus row
        )
        return Admission(verify=plan, skipped=skip, stale=False)

    def verify(self, request: Request) -> Result:
        result = super().verify(request)
        self._note_drafts(result.num_accepted, int(result.rejected))
        if result.rejected:  # a committed token differs from this chain's draft
            self._died(result.position + result.num_accepted)
        return result


@dataclass
class Branch:
    """A conditional chain (*branch*): drafts after `token` at `position`, for `epoch` + 1."""

    epoch: int  # the chain it branches from
    position: int
    token: int
    drafts: list[DraftItem] = field(default_factory=list)
    sent: bool = False


class EagerDrafter(Drafter):
    """Device state for one eager generation: a Drafter that adopts committed tokens."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.branch: Branch | None = None  # at most one open at a time
        self.branches = {"opened": 0, "sent": 0, "promoted": 0}
        self.branching = True  # whether unsure drafts open branches (a controller may say no)
        # drafts as branches see them, counted at adoption (planner.Controller learns them):
        # matched / of them unsure / did not match / of them unsure / of those, the committed
        # token was the branch token (the most likely one other than the draft)
        self.confidence = dict.fromkeys(
            ("match", "unsure_match", "miss", "unsure_miss", "second"), 0
        )
        self._unsure: dict[int, tuple[bool, int]] = {}  # position -> (unsure, branch token)

    def _drafted(self, row: torch.Tensor, draft: DraftItem) -> None:
        """Note whether the draft model's own law is unsure at `draft`'s position, and open a
        branch there if so (*branch*). Reads the law and the draft's token only for which
        token to branch on: whether to branch never depends on the value drawn."""
        below, end = self.config.branch_below, self.config.max_new_tokens
        if not below:
            return
        values, indices = row.topk(2)
        first, second = (int(i) for i in indices)
        token = second if first == draft.token else first
        # the top probability, 1 / sum exp(row - max): no softmax of the whole row in float64
        # (0.56 instead of 0.94 ms on a 151,936-entry row, one core of this box)
        unsure = 1.0 / float(torch.exp(row - values[0]).sum(dtype=torch.float64)) < below
        self._unsure[draft.position] = (unsure, token)
        if not unsure or not self.branching or self.branch is not None or draft.position + 1 >= end:
            return
        self.branch = Branch(self.epoch, draft.position, token)
        self.branches["opened"] += 1

    def _count(self, position: int, token: int, matched: bool) -> None:
        """`token` committed at `position` against this chain's draft there (`confidence`)."""
        unsure, branch_token = self._unsure.pop(position, (None, 0))
        if unsure is None:  # not drafted through `_drafted` (no branches, or a branch's draft)
            return
        c = self.confidence
        key = "match" if matched else "miss"
        c[key] += 1
        c[f"unsure_{key}"] += unsure
        c["second"] += unsure and not matched and token == branch_token

    def branch_due(self) -> bool:
        """An open branch waits to be drafted, its position's draft already sent."""
        self._prune_branch()
        branch = self.branch
        return (
            branch is not None and not branch.sent and branch.position < self.frontier + self.sent
        )

    def draft_branch(self) -> Chunk | None:
        """Draft the open branch (`branch_len` forward passes, preemptible through `cancel`)
        and return its request (epoch + 1, the branch token fixed at its position); None if
        it has nothing to draft. The draft model's sequence is as before afterwards."""
        if not self.branch_due():
            return None
        branch = self.branch
        keep = [d.token for d in self.drafts[branch.position - self.frontier :]]
        end = min(branch.position + 1 + self.config.branch_len, self.config.max_new_tokens)
        self.ctx.truncate(branch.position)
        self.ctx.append([branch.token])
        try:
            for position in range(branch.position + 1, end):  # a fixed count: timing only
                item = self._draw(self.ctx.logits(cancel=self.cancel)[0], position, None)
                self.ctx.append([item.token])
                branch.drafts.append(item)
        except Cancelled:
            self.branch = None
            raise
        finally:
            self.ctx.truncate(branch.position)
            self.ctx.append(keep)
        branch.sent = True
        self.branches["sent"] += 1
        return Chunk(
            epoch=branch.epoch + 1,
            position=branch.position,
            fixed=(branch.token,),
            drafts=tuple(branch.drafts),
            final=False,
        )

    def _prune_branch(self) -> None:
        """Drop a branch whose chain or position is gone."""
        branch = self.branch
        if branch is not None and (branch.epoch != self.epoch or branch.position < self.frontier):
            self.branch = None

    def _promotion(self, token: int) -> Branch | None:
        """The sent branch that `token`, committed at the frontier against the draft there,
        makes the next chain (*promote*), or None."""
        branch = self.branch
        if (
            branch is None
            or not branch.sent
            or (branch.epoch, branch.position, branch.token) != (self.epoch, self.frontier, token)
            or not self.drafts
        ):
            return None
        self.branch = None
        self.branches["promoted"] += 1
        return branch

    def contradicts(self, position: int, tokens: tuple[int, ...] | list[int]) -> bool:
        """Whether a committed token from `position` differs from this side's draft at its
        position: adopting it will void every draft, so a draft step in flight is wasted
        (*interrupt*). Reads state only (the reader calls it while a step may be appending a
        draft in the worker thread; `adopt` alone changes the drafts it compares)."""
        frontier, drafts = self.frontier, self.drafts
        for offset, token in enumerate(tokens):
            index = position + offset - frontier
            if 0 <= index < len(drafts) and drafts[index].token != int(token):
                return True
        return False

    def adopt(self, position: int, tokens: tuple[int, ...] | list[int]) -> Outcome:
        """Commit the cloud's tokens from `position` (module docstring: *adopt*)."""
        if position > self.frontier:
            raise TandemError(f"spec: committed tokens from {position}, frontier {self.frontier}")
        start = self.frontier
        matched, rollback = 0, False
        for token in list(tokens)[start - position :]:  # those not known yet
            if self.done:
                break
            token = int(token)
            if self.drafts and self.drafts[0].token == token:
                self._count(self.frontier, token, True)
                self.drafts.pop(0)
                self.sent = max(0, self.sent - 1)
                self.committed.append(token)
                matched += 1
            else:
                promoted = self._promotion(token)
                if self.drafts:  # the cloud's token differs from the draft here: new chain
                    self._count(self.frontier, token, False)
                    self._unsure.clear()  # the chain's other drafts are void
                    rollback = True
                    self._codec_backtrack(self.drafts[0])
                    self.drafts.clear()
                    self.sent = 0
                    self.epoch += 1
                self.ctx.truncate(self.frontier)
                self.committed.append(token)
                self.ctx.append([token])
                if promoted is not None:  # the branch is the new chain, at the cloud already
                    self.drafts, self.sent = list(promoted.drafts), len(promoted.drafts)
                    self.ctx.append([d.token for d in promoted.drafts])
        self._prune_branch()
        self._trim_to_stop()
        return Outcome(
            committed=tuple(self.committed[start:]),
            num_accepted=matched,
            rejected=rollback,
            bonus=False,
        )
