"""Imagination on the world model's latent: the policy acts without frames being decoded.

With ``domain.imagine_input=latent`` an imagined rollout decodes no frame for the policy: a small
:class:`LatentAdapter` maps the WM's latent of a step (with the latent and the pixel encoder's
features of the rollout's real first frame, and the instruction's mean word embedding, which
conditions the policy's image encoder) to an estimate of what the policy's pixel encoder would take
from the decoded frame: its packed visual features ``[B, F]``
(:meth:`wmrl_vla.policy.SmallVLA.visual_features`: the FiLM patch and keypoint tokens and the
locator's table xy). The policy's trunk and action head read those features as they read the
pixel encoder's (:class:`LatentActor`), so the GRPO update on imagined rollouts (log-probs
recomputed on the stored features) trains the same trunk and head that act in the simulator; the
pixel encoder itself learns from the simulated (anchor) rollouts only.

The adapter is distilled from the pixel encoder on the world model's own rollouts:
``adapter(z, z0, f0, s) ~ encoder(decode(z), s)`` (:func:`distill_loss`, a mean squared error of the
change since the first frame, standardised per column, :func:`feature_stats`), first at build time
on imagined rollouts of the SFT policy (:func:`fit_latent_adapter`), then refreshed after each
imagined batch on a sample of its latents decoded for that purpose only
(:func:`refresh_latent_adapter`), so it follows the world model's and the encoder's updates.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from world_models.vla_dynamics import instruction_ids


def feature_stats(targets: torch.Tensor, min_std: float = 1e-3) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-column mean and standard deviation (at least ``min_std``) of ``targets`` ``[N, F]``:
    ``[F]`` each."""
    if targets.dim() != 2 or targets.shape[0] < 2:
        raise ValueError(f"targets must be [N >= 2, F], got {tuple(targets.shape)}")
    return targets.mean(0), targets.std(0).clamp(min=min_std)


class LatentAdapter(nn.Module):
    """Estimate of the policy's packed visual features ``[B, F]`` of an imagined step, from the WM
    latent of that step ``z`` ``[B, D]``, the latent of the rollout's first (real) frame ``z0``
    ``[B, D]``, the pixel encoder's features of that first frame ``f0`` ``[B, F]`` and the
    instruction's mean word embedding ``sentence`` ``[B, d]``:

        features = f0 + std * MLP([z, z0, sentence, (f0 - in_mean) / in_std])

    The world model's latent need not hold the static scene (its decoder takes that from the first
    frame's feature maps), so what does not move (where the named object is, for the locator) comes
    from ``f0`` and the MLP predicts the change since the first frame. ``std`` ``[F]`` scales that
    change (its spread) and ``in_mean`` / ``in_std`` standardise the features (buffers set by
    :meth:`set_normalisation`), so every column weighs the same in :func:`distill_loss` whatever
    its scale (patch tokens vs the locator's table xy). The MLP's last layer starts at zero: an
    untrained adapter copies the first frame's features, the baseline distillation has to beat."""

    def __init__(self, latent_dim: int, cond_dim: int, feature_dim: int, hidden: int = 256) -> None:
        super().__init__()
        if min(latent_dim, cond_dim, feature_dim, hidden) < 1:
            raise ValueError(
                f"latent_dim={latent_dim}, cond_dim={cond_dim}, feature_dim={feature_dim} and "
                f"hidden={hidden} must all be >= 1"
            )
        self.latent_dim, self.cond_dim, self.feature_dim = latent_dim, cond_dim, feature_dim
        self.net = nn.Sequential(
            nn.Linear(2 * latent_dim + cond_dim + feature_dim, hidden),
            nn.GELU(),
            nn.Linear(hidden, hidden),
            nn.GELU(),
            nn.Linear(hidden, feature_dim),
        )
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)
        self.register_buffer("in_mean", torch.zeros(feature_dim))
        for name in ("std", "in_std"):
            self.register_buffer(name, torch.ones(feature_dim))

    def set_normalisation(self, targets: torch.Tensor, f0: torch.Tensor) -> None:
        """From distillation targets ``[N, F]`` and their rollouts' first-frame features ``[N, F]``."""
        in_mean, in_std = feature_stats(targets)
        self.in_mean.copy_(in_mean.to(self.in_mean.device))
        self.in_std.copy_(in_std.to(self.in_std.device))
        self.std.copy_(feature_stats(targets - f0)[1].to(self.std.device))

    def standardised(
        self, z: torch.Tensor, z0: torch.Tensor, f0: torch.Tensor, sentence: torch.Tensor
    ) -> torch.Tensor:
        """``[B, F]`` prediction of ``(features - f0) / std``."""
        b = z.shape[0]
        if z.dim() != 2 or z.shape[1] != self.latent_dim or z0.shape != z.shape:
            raise ValueError(
                f"z and z0 have shapes {tuple(z.shape)}, {tuple(z0.shape)}, expected [B, {self.latent_dim}] both"
            )
        if f0.shape != (b, self.feature_dim) or sentence.shape != (b, self.cond_dim):
            raise ValueError(
                f"f0 and sentence have shapes {tuple(f0.shape)}, {tuple(sentence.shape)}, expected "
                f"({b}, {self.feature_dim}) and ({b}, {self.cond_dim})"
            )
        f0n = (f0.float() - self.in_mean) / self.in_std
        return self.net(torch.cat([z.float(), z0.float(), sentence.float(), f0n], -1))

    def forward(
        self, z: torch.Tensor, z0: torch.Tensor, f0: torch.Tensor, sentence: torch.Tensor
    ) -> torch.Tensor:
        change = self.standardised(z, z0, f0, sentence)  # checks the shapes
        return f0 + self.std * change


def distill_loss(
    adapter: LatentAdapter, inputs: tuple[torch.Tensor, ...], targets: torch.Tensor
) -> torch.Tensor:
    """``mean((adapter.standardised(*inputs) - (targets - f0) / std)^2)`` over rows and
    columns: ``inputs`` = (z ``[B, D]``, z0 ``[B, D]``, f0 ``[B, F]``, sentence ``[B, d]``), ``targets``
    ``[B, F]`` (the pixel encoder's features of the frames decoded from ``z``)."""
    f0 = inputs[2]
    target = (targets - f0) / adapter.std
    return F.mse_loss(adapter.standardised(*inputs), target)


def distill(
    adapter: LatentAdapter,
    optimizer: torch.optim.Optimizer,
    inputs: tuple[torch.Tensor, ...],
    targets: torch.Tensor,
    steps: int,
    batch_size: int = 256,
    generator: torch.Generator | None = None,
) -> list[float]:
    """``steps`` optimizer steps of :func:`distill_loss` on minibatches of ``batch_size`` rows drawn
    with replacement from ``inputs`` (z, z0, f0, sentence; ``N`` rows each) and ``targets``
    ``[N, F]`` (on the adapter's device). Gradients are enabled here (a caller may run under
    ``torch.no_grad``). Returns the losses."""
    n = targets.shape[0]
    if any(x.shape[0] != n for x in inputs):
        raise ValueError(f"inputs have {[x.shape[0] for x in inputs]} rows, targets {n}")
    adapter.train()
    losses = []
    with torch.enable_grad():
        for _ in range(steps):
            j = torch.randint(n, (min(batch_size, n),), generator=generator).to(targets.device)
            loss = distill_loss(adapter, tuple(x[j].detach() for x in inputs), targets[j].detach())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
    adapter.eval()
    return losses


@torch.no_grad()
def encoder_targets(
    policy, wm, init_images: torch.Tensor, z: torch.Tensor, instr: torch.Tensor, chunk: int = 256
):
    """The pixel encoder's features of the frames the world model decodes from latents: ``z``
    ``[M, D]`` of rollouts whose first frames are ``init_images`` ``[M, 3, H, W]`` uint8 (the
    decoder's context), instruction ids ``instr`` ``[M, L]`` -> ``[M, F]`` on the policy's device."""
    dev = policy.centers.device
    out = []
    for s in range(0, z.shape[0], chunk):
        sl = slice(s, s + chunk)
        frames = wm.frames_from_latents(init_images[sl], z[sl])
        out.append(policy.visual_features(frames.to(dev), instr[sl].to(dev)))
    return torch.cat(out)


class LatentActor:
    """The policy acting on the world model's latent, as :meth:`VLADynamics.imagine`'s callback
    (``observe="latents"``): ``actor(z [B, D], states [B, S], t) -> actions [B, A]``.

    At step 0 the policy reads the pixel encoder's features of the real first frames ``f0``
    (``first_frames`` ``[B, 3, H, W]`` uint8, encoded once; pass ``f0`` ``[B, F]`` to reuse them),
    as the pixel path does; at later steps the adapter's estimate from ``(z, z0, f0, sentence)``.
    Records the sampled bins, their log-probs and the features read (``[B, A]``, ``[B, A]``,
    ``[B, F]`` per step, on the CPU; :meth:`stacked`). ``noise`` ``[B, T, A]``: each rollout's
    sampling uniforms (else ``generator``)."""

    def __init__(
        self,
        policy,
        adapter: LatentAdapter,
        instr: torch.Tensor,
        temperature: float,
        generator: torch.Generator | None = None,
        first_frames: torch.Tensor | None = None,
        f0: torch.Tensor | None = None,
        noise: torch.Tensor | None = None,
    ) -> None:
        if (first_frames is None) == (f0 is None):
            raise ValueError("pass exactly one of first_frames, f0")
        self.policy, self.adapter, self.temperature, self.generator, self.noise = (
            policy, adapter, temperature, generator, noise
        )  # fmt: skip
        dev = policy.centers.device
        self.instr = instr.to(dev)
        with torch.no_grad():
            self.sentence = policy.sentence(self.instr)
            self.f0 = policy.visual_features(first_frames.to(dev), self.instr) if f0 is None else f0.to(dev)
        self.z0: torch.Tensor | None = None
        self.bins: list[torch.Tensor] = []
        self.logprobs: list[torch.Tensor] = []
        self.features: list[torch.Tensor] = []

    @torch.no_grad()
    def __call__(self, z: torch.Tensor, states: torch.Tensor, t: int) -> torch.Tensor:
        z = z.to(self.f0.device)
        if t == 0:
            self.z0, feats = z, self.f0
        else:
            feats = self.adapter(z, self.z0, self.f0, self.sentence)
        kw = {} if self.noise is None else {"noise": self.noise[:, t]}
        bins, lp, a = self.policy.act(
            None, states, self.instr, self.temperature, self.generator, features=feats, **kw
        )
        self.bins.append(bins)
        self.logprobs.append(lp)
        self.features.append(feats.cpu())
        return a

    def stacked(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """bins ``[B, T, A]``, log-probs ``[B, T, A]``, features ``[B, T, F]``."""
        return torch.stack(self.bins, 1), torch.stack(self.logprobs, 1), torch.stack(self.features, 1)


# Distillation steps between two held-out checks when the adapter is first fitted.
LATENT_CHECK_EVERY = 50
# Latents (rollout steps) decoded per refresh of the latent adapter after an imagined batch.
LATENT_REFRESH_SAMPLES = 64


def fit_latent_adapter(
    policy,
    wm,
    imgs: torch.Tensor,
    sts: torch.Tensor,
    texts: list[str],
    goals: torch.Tensor,
    limits: torch.Tensor,
    group_size: int,
    temperature: float,
    gen: torch.Generator,
    steps: int = 500,
) -> tuple[LatentAdapter, torch.optim.Optimizer, dict[str, float]]:
    """Distill a new :class:`LatentAdapter` from ``policy``'s pixel encoder on the world model ``wm``'s
    own rollouts: ``B`` rollouts (``group_size`` consecutive ones per task) from first frames ``imgs``
    ``[B, 3, H, W]`` uint8, states ``sts`` ``[B, S]``, instructions ``texts``, goals ``[B, 2]``, imagined
    for ``limits`` ``[B]`` steps with the policy acting on decoded frames at ``temperature``. Every
    5th task is held out to stop the distillation early (the state of lowest held-out loss, checked every
    ``LATENT_CHECK_EVERY`` steps, the untrained copy of the first frame included) and to measure
    the fit (so the held-out figures are slightly optimistic): ``latent/heldout_mse`` (squared
    error of the features standardised by their spread), ``latent/heldout_tv`` (total variation between the policy's per-dimension
    action distributions from the adapter's features and from the encoder's, mean over steps and
    dimensions), ``latent/heldout_agreement`` (how often their greedy bins agree), and the same
    two for copying the first frame's features (``..._first_frame``, the baseline to beat).
    Returns (adapter, its optimizer, those figures)."""
    pol, dev = policy, policy.centers.device
    instr = pol.tokenizer.encode(texts)
    horizon = int(limits.max())
    pol.eval()
    wm.eval()

    def act(f: torch.Tensor, s: torch.Tensor, t: int) -> torch.Tensor:
        return pol.act(f, s, instr, temperature, gen)[2]

    out = wm.imagine(
        imgs,
        sts,
        act,
        horizon,
        success_threshold=2.0,
        generator=gen,
        instr=instruction_ids(texts),
        goal=goals,
    )  # the whole horizon
    mask = torch.arange(horizon).unsqueeze(0) < limits.unsqueeze(1)  # [B, T]
    b = mask.shape[0]
    rows = torch.arange(b).unsqueeze(1).expand_as(mask)[mask]
    with torch.no_grad():
        targets = pol.visual_features(out["images"][mask].to(dev), instr[rows].to(dev))
        f0 = pol.visual_features(imgs.to(dev), instr.to(dev))[rows]
        sentence = pol.sentence(instr[rows].to(dev))
    z = out["latents"].to(dev)
    inputs = (z[mask.to(dev)], z[:, 0][rows.to(dev)], f0, sentence)
    held = (rows // group_size % 5 == 4).to(dev)
    adapter = LatentAdapter(z.shape[-1], sentence.shape[1], pol.feature_dim).to(dev)
    adapter.set_normalisation(targets[~held], f0[~held])
    opt = torch.optim.Adam(adapter.parameters(), lr=1e-3)
    fit = tuple(x[~held] for x in inputs)
    h_in = tuple(x[held] for x in inputs)

    def held_loss() -> float:
        with torch.no_grad():
            return float(distill_loss(adapter, h_in, targets[held]))

    # early stopping on the held-out tasks, checked every LATENT_CHECK_EVERY steps; step 0 (the
    # untrained adapter: the first frame's features) included
    best, best_state, hist = held_loss(), copy.deepcopy(adapter.state_dict()), []
    for done in range(0, steps, LATENT_CHECK_EVERY):
        hist += distill(
            adapter, opt, fit, targets[~held], min(LATENT_CHECK_EVERY, steps - done), generator=gen
        )
        if (loss := held_loss()) < best:
            best, best_state = loss, copy.deepcopy(adapter.state_dict())
    adapter.load_state_dict(best_state)
    with torch.no_grad():
        st, ins = out["states"][mask].to(dev)[held], instr[rows].to(dev)[held]
        p_pix = torch.softmax(pol.logits_from_features(targets[held], st, ins), -1)  # [M, A, K]
        err = ((adapter(*h_in) - targets[held]) / adapter.in_std) ** 2
        stats = {"latent/fit_samples": float((~held).sum()), "latent/fit_loss": hist[-1],
                 "latent/heldout_mse": float(err.mean())}  # fmt: skip
        for name, feats in (("", adapter(*h_in)), ("_first_frame", h_in[2])):
            p = torch.softmax(pol.logits_from_features(feats, st, ins), -1)
            stats[f"latent/heldout_tv{name}"] = float(0.5 * (p - p_pix).abs().sum(-1).mean())
            stats[f"latent/heldout_agreement{name}"] = float(
                (p.argmax(-1) == p_pix.argmax(-1)).float().mean()
            )
    return adapter, opt, stats


def refresh_latent_adapter(
    adapter: LatentAdapter,
    optimizer: torch.optim.Optimizer,
    policy,
    wm,
    imgs: torch.Tensor,
    latents: torch.Tensor,
    f0: torch.Tensor,
    instr: torch.Tensor,
    lengths: list[int],
    steps: int,
    generator: torch.Generator,
    samples: int = LATENT_REFRESH_SAMPLES,
) -> float:
    """``steps`` distillation steps of ``adapter`` on up to ``samples`` latents of the batch just
    imagined (``latents`` ``[B, T, D]``, rollout ``i`` real for ``lengths[i]`` steps, first frames
    ``imgs`` ``[B, 3, H, W]`` whose features are ``f0`` ``[B, F]``), decoded now for this purpose only,
    with the current encoder's targets. Returns the loss before these steps (held out)."""
    b, t = latents.shape[:2]
    real = torch.arange(t).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)  # [B, T]
    rows, cols = real.nonzero(as_tuple=True)
    pick = torch.randperm(rows.numel(), generator=generator)[:samples]
    rows, cols = rows[pick], cols[pick]
    dev = policy.centers.device
    policy.eval()
    z = latents[rows, cols].to(dev)
    targets = encoder_targets(policy, wm, imgs[rows], z, instr[rows])
    with torch.no_grad():
        sentence = policy.sentence(instr[rows].to(dev))
    inputs = (z, latents[rows, 0].to(dev), f0[rows.to(f0.device)].to(dev), sentence)
    hist = distill(
        adapter,
        optimizer,
        inputs,
        targets,
        steps,
        generator=generator,
    )
    return hist[0]
