"""The agreement rule forces the engine along the oracle's tokens, not its own.

The stub engine here behaves like a correct rung whose first step is a legal near tie: from
the oracle's prefix it picks the oracle's token at every later step; from any other prefix
it continues elsewhere (as a real model does after a different token). Judged along the
oracle's path it passes with one near tie; forced along its own free-running tokens, every
later step would be a flip and a correct rung would be refused."""
import torch

from onelaunch.measure.agree import judge

V, N = 16, 3
REF = torch.tensor([3, 5, 7])                  # the oracle's greedy tokens
NEAR = 4                                       # the engine's choice at step 0: a near tie
FAR = 11                                       # where it goes from any prefix but the oracle's


def oracle_logits() -> torch.Tensor:
    lg = torch.zeros(N, V)
    for i, t in enumerate(REF.tolist()):
        lg[i, t] = 10.0
    lg[0, NEAR] = 10.0 - 0.0625                # 1 bf16 ulp of 10 below the top: a near tie
    return lg


class PrefixEngine:
    """A step's token depends on the tokens it was forced along, as a real decoder's does."""

    def choose(self, step: int, prefix: list[int]) -> int:
        if step == 0:
            return NEAR
        return int(REF[step]) if prefix == REF[:step].tolist() else FAR

    def generate(self, prompt, n, graph=False):
        out = []
        for i in range(n):
            out.append(self.choose(i, out))
        return torch.tensor(out)

    def teacher_forced(self, prompt, forced, graph=False):
        forced = torch.as_tensor(forced).tolist()
        return torch.tensor([self.choose(i, forced[:i]) for i in range(len(forced))])


def test_judge_forces_along_the_oracles_tokens():
    r = judge(PrefixEngine(), torch.tensor([1, 2]), (REF, oracle_logits()), graph=False)
    assert r["ok"], r["flips"]
    assert r["agree"] == "2/3"
    assert [f["verdict"] for f in r["flips"]] == ["near tie"]
    # its own path leaves the oracle's at step 0 and never comes back: judged along it,
    # the later steps would be flips
    assert r["tokens"] == [NEAR, FAR, FAR] and r["agree_free"] == "0/3"


def test_the_stub_can_fail():
    """The same engine forced along its own tokens: the two later steps are real flips."""
    eng = PrefixEngine()
    own = eng.generate(None, N)
    assert eng.teacher_forced(None, own).tolist() == [NEAR, FAR, FAR]
