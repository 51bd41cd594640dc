"""The pull of PPO's clip on off-policy rows (benchmarks/off_policy_clip_pull.py): the
quadrature figures the docs quote against Monte Carlo estimates through the library's own loss
functions, and the committed JSON against the script."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from myriad.finetune.losses import dual_clipped_surrogate, leader_trust_region_surrogate

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location(
    "off_policy_clip_pull", ROOT / "benchmarks" / "off_policy_clip_pull.py"
)
assert spec is not None and spec.loader is not None
pull = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pull)


def monte_carlo(
    dims: int, offset: float, std: float, form: str, n: int = 400_000, seed: int = 0
) -> dict[str, float]:
    """The objective's gradient (minus the mean loss) for the leader N(0, I) on n rows drawn
    from the follower N(offset e_1, std^2 I) with advantages N(0, 1) independent of them."""
    g = torch.Generator().manual_seed(seed)
    mean = torch.zeros(dims, dtype=torch.float64, requires_grad=True)
    log_std = torch.zeros(dims, dtype=torch.float64, requires_grad=True)
    centre = torch.zeros(dims, dtype=torch.float64)
    centre[0] = offset
    actions = centre + std * torch.randn(n, dims, generator=g, dtype=torch.float64)
    advantages = torch.randn(n, generator=g, dtype=torch.float64)
    leader = torch.distributions.Normal(mean, log_std.exp()).log_prob(actions).sum(1)
    follower = torch.distributions.Normal(centre, torch.full((dims,), std, dtype=torch.float64))
    behaviour = follower.log_prob(actions).sum(1)
    if form == "leader":
        loss = leader_trust_region_surrogate(
            leader, leader.detach(), behaviour, advantages, pull.CLIP
        )
    else:
        dual = pull.DUAL_CLIP if form == "behaviour_dual_clip" else None
        loss = dual_clipped_surrogate(leader, behaviour, advantages, pull.CLIP, dual)
    loss.mean().backward()
    assert mean.grad is not None and log_std.grad is not None
    return {"mean": -float(mean.grad[0]), "log_std": -float(log_std.grad.sum())}


#: Every case and form but the plain clip with a follower narrower than 1/sqrt(2) of the leader,
#: whose rows with ratios far above 1 give the gradient an infinite variance, so that no Monte
#: Carlo check holds (the dual clip, which bounds those ratios, is checked there).
CHECKED = [
    (case, form)
    for case in pull.CASES
    for form in ("behaviour", "behaviour_dual_clip", "leader")
    if not (form == "behaviour" and case[2] ** 2 < 0.5)
]


@pytest.mark.parametrize(("case", "form"), CHECKED)
def test_quadrature_agrees_with_the_loss_functions(case, form):
    dims, offset, std = case
    row = pull.run_case(dims, offset, std)
    estimate = monte_carlo(dims, offset, std, form)
    for key in ("mean", "log_std"):
        # 400,000 rows: the estimates' standard errors are about 0.005 at most here.
        assert estimate[key] == pytest.approx(row[form][key], abs=0.02), (key, estimate)


def test_the_authors_clip_pulls_the_leader_towards_the_follower():
    wider = pull.expected_pull(1, 0.0, 1.5)
    narrower = pull.expected_pull(1, 0.0, 0.7)
    shifted = pull.expected_pull(1, 0.5, 1.0)
    assert wider["log_std"] > 0.3 and narrower["log_std"] < -0.3 and shifted["mean"] > 0.25
    # The same follower as the leader: every ratio is 1, no pull.
    assert pull.expected_pull(1, 0.0, 1.0) == {"mean": 0.0, "log_std": 0.0}


def test_committed_json_is_the_scripts_output():
    committed = json.loads((ROOT / "benchmarks/results/off_policy_clip_pull.json").read_text())
    assert committed["cases"] == pull.run()["cases"]
