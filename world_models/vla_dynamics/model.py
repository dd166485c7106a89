"""The ensemble world model :class:`VLADynamics`: ``observe`` / ``imagine`` / ``loss`` (see the package
docstring, :mod:`world_models.vla_dynamics`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict

import torch
import torch.nn.functional as F
from huggingface_hub import PyTorchModelHubMixin
from torch import nn

from world_models.vla_dynamics.config import GOAL_DIM, VLADynamicsConfig
from world_models.vla_dynamics.networks import (
    FrameDecoder,
    FrameEncoder,
    GroundedMember,
    Grounding,
    Member,
    to_uint8,
    to_unit,
)


class VLADynamics(nn.Module, PyTorchModelHubMixin, library_name="wmrl", tags=["wmrl", "world-model"]):
    """The ensemble world model. See the module docstring.

    ``save_pretrained(DIR)`` / ``VLADynamics.from_pretrained(DIR or hub repo)`` (huggingface_hub's
    ``PyTorchModelHubMixin``): ``model.safetensors`` + ``config.json`` (``{"cfg": ...}``).
    """

    def __init__(self, cfg: VLADynamicsConfig | dict) -> None:
        super().__init__()
        if isinstance(cfg, dict):  # from config.json (from_pretrained)
            cfg = VLADynamicsConfig(**cfg)
        self.cfg = cfg
        chans = (16, 32, 64, 64)
        self.encoder = FrameEncoder(chans)
        feat = chans[-1] * (cfg.image_size // 16) ** 2
        self.to_latent = nn.Sequential(
            nn.Linear(feat + cfg.state_dim, cfg.latent_dim), nn.LayerNorm(cfg.latent_dim)
        )
        self.instruction_film = None
        if cfg.instruction_buckets:
            # mean of the words' (gamma, beta) per channel of the last feature map; zero at the start
            self.instruction_film = nn.EmbeddingBag(
                cfg.instruction_buckets + 1, 2 * chans[-1], mode="mean", padding_idx=0
            )
            nn.init.zeros_(self.instruction_film.weight)
        self.members = nn.ModuleList(
            Member(cfg.latent_dim, cfg.action_dim, cfg.hidden_dim) for _ in range(cfg.n_members)
        )
        self.state_head = nn.Sequential(
            nn.Linear(cfg.latent_dim, cfg.hidden_dim), nn.GELU(), nn.Linear(cfg.hidden_dim, cfg.state_dim)
        )
        self.grounded = None
        if cfg.outcome_input == "state":
            embed = 32
            self.task_embed = nn.Linear(cfg.latent_dim, embed)
            self.instruction_task = None  # the outcome heads' task from the instruction ("geometry")
            if cfg.outcome_reads == "geometry":
                self.instruction_task = nn.EmbeddingBag(
                    cfg.instruction_buckets + 1, embed, mode="mean", padding_idx=0
                )
            self.grounded = nn.ModuleList(
                GroundedMember(
                    cfg.state_dim,
                    cfg.action_dim,
                    embed,
                    cfg.hidden_dim,
                    integrator=cfg.state_integrator,
                    geometric=cfg.outcome_reads == "geometry",
                )
                for _ in range(cfg.n_members)
            )
        self.decoder = FrameDecoder(cfg.latent_dim, cfg.image_size, chans)
        self.unet = None
        if cfg.frame_decoder == "diffusion":
            from diffusers import DDIMScheduler, UNet2DModel

            self.unet = UNet2DModel(
                sample_size=cfg.image_size,
                in_channels=6,
                out_channels=3,
                block_out_channels=(32, 64, 64),
                down_block_types=("DownBlock2D", "DownBlock2D", "DownBlock2D"),
                up_block_types=("UpBlock2D", "UpBlock2D", "UpBlock2D"),
                layers_per_block=1,
                norm_num_groups=8,
                class_embed_type="identity",
                add_attention=False,
            )
            self.cond_proj = nn.Linear(cfg.latent_dim, 32 * 4)  # time_embed_dim = 4 * block_out_channels[0]
            self.scheduler = DDIMScheduler(num_train_timesteps=cfg.diffusion_train_timesteps)
            self.scheduler.set_timesteps(cfg.diffusion_steps)

    @property
    def device(self) -> torch.device:
        return self.to_latent[0].weight.device

    # ------------------------------------------------------------------ observe
    def observe(self, images: torch.Tensor, states: torch.Tensor, instr: torch.Tensor | None = None):
        """First frame ``[B, 3, H, W]`` uint8 + state ``[B, S]`` (+ ``instr`` ``[B, L]``, the
        :func:`instruction_ids` of each instruction, for a conditioned model) -> (z ``[B, D]``, context)."""
        s = self.cfg.image_size
        if images.dim() != 4 or images.shape[1:] != (3, s, s):
            raise ValueError(f"images have shape {tuple(images.shape)}, expected [B, 3, {s}, {s}]")
        dev = self.device
        frame0 = to_unit(images.to(dev))
        maps = self.encoder(frame0)
        feat = maps[-1]
        if self.instruction_film is not None:
            if instr is None or instr.shape[0] != images.shape[0]:
                raise ValueError(
                    f"this world model is conditioned on instructions: pass instr [B={images.shape[0]}, L] "
                    f"(instruction_ids), got {None if instr is None else tuple(instr.shape)}"
                )
            gamma, beta = self.instruction_film(self._buckets(instr)).chunk(2, -1)  # [B, C] each
            feat = feat * (1 + gamma[:, :, None, None]) + beta[:, :, None, None]
        z = self.to_latent(torch.cat([feat.flatten(1), states.to(dev).float()], -1))
        return z, (maps, frame0)

    def _buckets(self, instr: torch.Tensor) -> torch.Tensor:
        """:func:`instruction_ids` ``[B, L]`` folded into this model's buckets (0 stays padding)."""
        ids = instr.to(self.device)
        return torch.where(ids > 0, (ids - 1) % self.cfg.instruction_buckets + 1, 0)

    # ------------------------------------------------------------------ decoding
    def decode(self, z: torch.Tensor, context) -> torch.Tensor:
        """Deterministic frame in [-1, 1], ``[B, 3, H, W]``."""
        maps, frame0 = context
        return self.decoder(z, maps, frame0)

    @torch.no_grad()
    def sample_frame(
        self, z: torch.Tensor, context, generator: torch.Generator | None = None, prepared=None
    ) -> torch.Tensor:
        """A frame as uint8 ``[B, 3, H, W]``: decoded, or sampled with DDIM for ``"diffusion"``.
        ``prepared``: ``self.decoder.prepare(*context)``, to reuse over a rollout's steps."""
        if self.unet is None:
            if prepared is None:
                return to_uint8(self.decode(z, context))
            return to_uint8(self.decoder.decode(z, prepared))
        _, frame0 = context
        cond = self.cond_proj(z)
        x = torch.randn(frame0.shape, generator=generator).to(frame0.device)
        for t in self.scheduler.timesteps:
            eps = self.unet(torch.cat([x, frame0], 1), t, class_labels=cond).sample
            x = self.scheduler.step(eps, t, x).prev_sample
        return to_uint8(x)

    def diffusion_loss(
        self, target: torch.Tensor, z: torch.Tensor, context, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Epsilon-prediction loss of the UNet on target frames ``[B, 3, H, W]`` in [-1, 1]; noise and
        timesteps drawn from ``generator`` (a CPU generator; None: the global RNG)."""
        _, frame0 = context
        noise = torch.randn(target.shape, generator=generator).to(target.device)
        t = torch.randint(0, self.cfg.diffusion_train_timesteps, (target.shape[0],), generator=generator)
        t = t.to(target.device)
        noisy = self.scheduler.add_noise(target, noise, t)
        eps = self.unet(torch.cat([noisy, frame0], 1), t, class_labels=self.cond_proj(z.detach())).sample
        return F.mse_loss(eps, noise)

    def grounding(
        self,
        z0: torch.Tensor,
        states: torch.Tensor,
        goal: torch.Tensor | None,
        instr: torch.Tensor | None = None,
    ) -> Grounding | None:
        """What the grounded heads read besides the state, constant over a rollout (a
        :class:`Grounding`); None for ``outcome_input="latent"``. ``goal``: the named object's
        table xy at reset (the simulator's placement, what :func:`wmrl_vla.rollout.goal_xy` reads),
        in metres; ``instr``: see :meth:`observe` (the outcome heads' task for
        ``outcome_reads="geometry"``)."""
        if self.grounded is None:
            return None
        b = z0.shape[0]
        if goal is None or tuple(goal.shape) != (b, GOAL_DIM):
            raise ValueError(
                f"this world model's outcome heads read the named object's position (outcome_input="
                f"'state'): pass goal [B={b}, {GOAL_DIM}], got {None if goal is None else tuple(goal.shape)}"
            )
        scene = self.task_embed(z0)
        task = scene
        if self.instruction_task is not None:
            if instr is None or instr.shape[0] != b:
                raise ValueError(
                    f"this world model's outcome heads read the instruction (outcome_reads='geometry'): "
                    f"pass instr [B={b}, L], got {None if instr is None else tuple(instr.shape)}"
                )
            task = self.instruction_task(self._buckets(instr))
        tip0 = states.to(z0.device).float()[:, :GOAL_DIM]
        return Grounding(goal.to(z0.device).float(), tip0, scene, task)

    # ------------------------------------------------------------------ scoring
    def score_actions(
        self,
        images: torch.Tensor,
        states: torch.Tensor,
        actions: torch.Tensor,
        mask: torch.Tensor,
        instr: torch.Tensor | None = None,
        goal: torch.Tensor | None = None,
    ):
        """Rollout of action sequences under every member, in latent space (or, for
        ``outcome_input="state"``, in proprioception: no latent is rolled forward).

        images ``[B, 3, H, W]`` uint8 and states ``[B, S]``: the first observation; actions
        ``[B, T, A]``; mask ``[B, T]`` (1 on real steps); instr ``[B, L]`` (see :meth:`observe`);
        goal ``[B, 2]`` (see :meth:`grounding`). Returns progress ``[K, B, T]`` and success
        probabilities ``[K, B, T]`` (0 after the mask ends), on the model's device.
        """
        z0, _ = self.observe(images, states, instr)
        actions, mask = actions.to(z0.device), mask.to(z0.device)
        ground = self.grounding(z0, states, goal, instr)
        progs, succs = [], []
        for k, m in enumerate(self.members):
            if ground is not None:
                _, prog, logit = self.grounded[k].roll(states.to(z0.device).float(), actions, ground)
            else:
                z, p_k, l_k = z0, [], []
                for t in range(actions.shape[1]):
                    z, p, logit = m.step(z, actions[:, t].float())
                    p_k.append(p)
                    l_k.append(logit)
                prog, logit = torch.stack(p_k, 1), torch.stack(l_k, 1)
            progs.append(prog * mask)
            succs.append(torch.sigmoid(logit) * mask)
        return torch.stack(progs), torch.stack(succs)

    @torch.no_grad()
    def frames_from_latents(
        self, images: torch.Tensor, z: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """uint8 frames ``[M, 3, H, W]`` decoded (or sampled) from latents ``z`` ``[M, D]`` of rollouts
        whose first frames are ``images`` ``[M, 3, H, W]`` uint8 (the decoder's context), as
        :meth:`imagine` decodes them."""
        if z.dim() != 2 or z.shape[0] != images.shape[0]:
            raise ValueError(f"z has shape {tuple(z.shape)}, expected ({images.shape[0]}, D)")
        frame0 = to_unit(images.to(self.device))
        return self.sample_frame(z.to(self.device), (self.encoder(frame0), frame0), generator)

    # ------------------------------------------------------------------ imagination
    @torch.no_grad()
    def imagine(
        self,
        images: torch.Tensor,
        states: torch.Tensor,
        policy: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor],
        horizon: int,
        members: torch.Tensor | None = None,
        success_threshold: float = 0.5,
        generator: torch.Generator | None = None,
        observe: str = "frames",
        instr: torch.Tensor | None = None,
        goal: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """Roll a whole batch forward together; the policy acts on predicted frames (``instr``: see
        :meth:`observe`; ``goal``: see :meth:`grounding`). With ``outcome_input="state"`` the
        states the policy gets and the outcomes come from the grounded heads.

        ``policy(images [B, 3, H, W] uint8, states [B, S], t) -> actions [B, A]`` (it may record
        whatever else it needs). Rollout ``i`` follows member ``members[i]`` (default ``i % K``) and
        ends after the first step whose success probability passes ``success_threshold``.
        ``observe="latents"``: the policy gets the latent ``z`` ``[B, D]`` in place of the frame and no
        frame is decoded (``images`` then holds the first frame at every step).

        Returns ``images`` ``[B, T, 3, H, W]`` (the frames the policy saw), ``latents`` ``[B, T, D]``
        (the latent of each of those steps), ``states`` ``[B, T, S]``, ``actions`` ``[B, T, A]``,
        ``progress`` / ``success`` ``[B, T]`` (the member's predictions after each action) and
        ``mask`` ``[B, T]``, all on the CPU. The model runs on its own device; ``policy`` gets frames
        (or latents) and states there and may return actions on any device.
        """
        if observe not in ("frames", "latents"):
            raise ValueError(f"observe={observe!r} is not one of frames, latents")
        decode = observe == "frames"
        b = images.shape[0]
        k = self.cfg.n_members
        dev = self.device
        members = torch.arange(b, device=dev) % k if members is None else members.to(dev)
        z, context = self.observe(images, states, instr)
        prepared = self.decoder.prepare(*context) if self.unet is None and decode else None
        frame, state = images.to(dev), states.to(dev).float()
        ground = self.grounding(z, states, goal, instr)
        mem = None if ground is None else self.grounded[0].initial_memory(state)
        alive = torch.ones(b, dtype=torch.bool, device=dev)
        out = {n: [] for n in ("images", "latents", "states", "actions", "progress", "success", "mask")}
        for t in range(horizon):
            out["images"].append(frame)
            out["latents"].append(z)
            out["states"].append(state)
            out["mask"].append(alive.float())
            a = policy(frame if decode else z, state, t).to(dev).float()  # [B, A]
            z_next = torch.empty_like(z)
            s_next = torch.empty_like(state)
            mem_next = None if mem is None else torch.empty_like(mem)
            prog = torch.empty(b, device=dev)
            succ = torch.empty(b, device=dev)
            for j, m in enumerate(self.members):
                sel = (members == j).nonzero().squeeze(-1)
                if sel.numel():
                    z_next[sel], prog[sel], logit = m.step(z[sel], a[sel])
                    if ground is not None:
                        s_next[sel], mem_next[sel], prog[sel], logit = self.grounded[j].step(
                            state[sel], mem[sel], a[sel], ground.rows(sel)
                        )
                    succ[sel] = torch.sigmoid(logit)
            out["actions"].append(a)
            out["progress"].append(prog * alive)
            out["success"].append(succ * alive)
            alive = alive & (succ < success_threshold)
            z = z_next
            if t + 1 < horizon:
                state, mem = (self.state_head(z), None) if ground is None else (s_next, mem_next)
                if decode:
                    frame = self.sample_frame(z, context, generator, prepared)
            if not alive.any():
                # pad the remaining steps with copies (masked out)
                for _ in range(t + 1, horizon):
                    for n in out:
                        out[n].append(
                            out[n][-1]
                            if n not in ("mask", "progress", "success")
                            else torch.zeros(b, device=dev)
                        )
                break
        return {n: torch.stack(v, 1).cpu() for n, v in out.items()}

    # ------------------------------------------------------------------ training
    def loss(
        self,
        batch: dict[str, torch.Tensor],
        member_ids: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, dict]:
        """Open-loop multi-step loss on windows.

        ``batch``: ``images`` ``[B, H+1, 3, h, w]`` uint8, ``states`` ``[B, H+1, S]``, ``actions``
        ``[B, H, A]``, ``progress``/``success`` ``[B, H]``, ``frame_mask`` ``[B, H]`` (1 where the next
        frame is known), ``step_mask`` ``[B, H]`` (1 on real steps), ``instr`` ``[B, L]``. Row ``i``
        trains member ``member_ids[i]`` (default: every member on every row). The grounded heads of
        ``outcome_input="state"`` train on their own windows (:meth:`grounded_loss`). The frames
        decoded (``frame_fraction``) and the diffusion noise are drawn from ``generator`` (a CPU
        generator; None: the global RNG, which other work in the process may draw from too).
        """
        imgs, sts, acts = batch["images"], batch["states"], batch["actions"]
        b, h = acts.shape[:2]
        z0, context = self.observe(imgs[:, 0], sts[:, 0], batch.get("instr"))
        step_mask = batch["step_mask"].float()
        frame_mask = batch["frame_mask"].float() * step_mask
        target_frames = to_unit(imgs[:, 1:])  # [B, H, 3, h, w]
        losses = {"frame": 0.0, "state": 0.0, "progress": 0.0, "success": 0.0, "diffusion": 0.0}
        n_members = len(self.members)
        for j, m in enumerate(self.members):
            rows = _member_rows(member_ids, j, b, z0.device)
            if rows.numel() == 0:
                continue
            z = z0[rows]
            ctx = ([mp[rows] for mp in context[0]], context[1][rows])
            zs, ps, ls = [], [], []
            for t in range(h):
                z, p, logit = m.step(z, acts[rows, t].float())
                zs.append(z)
                ps.append(p)
                ls.append(logit)
            zs_t = torch.stack(zs, 1)  # [b_j, H, D]
            sm, fm = step_mask[rows], frame_mask[rows]
            denom = sm.sum().clamp(min=1)
            losses["progress"] = (
                losses["progress"]
                + (((torch.stack(ps, 1) - batch["progress"][rows].float()) ** 2) * sm).sum() / denom
            )
            bce = F.binary_cross_entropy_with_logits(
                torch.stack(ls, 1), batch["success"][rows].float(), reduction="none"
            )
            losses["success"] = losses["success"] + (bce * sm).sum() / denom
            st_err = ((self.state_head(zs_t) - sts[rows, 1:].float()) ** 2).mean(-1)
            losses["state"] = losses["state"] + (st_err * fm).sum() / fm.sum().clamp(min=1)
            flat = fm.reshape(-1).nonzero().squeeze(-1)
            if self.training and self.cfg.frame_fraction < 1 and flat.numel() > 1:
                keep = max(1, int(round(flat.numel() * self.cfg.frame_fraction)))
                flat = flat[torch.randperm(flat.numel(), generator=generator)[:keep]]
            if flat.numel():
                zf = zs_t.reshape(-1, zs_t.shape[-1])[flat]
                rep = flat // h  # row (within rows) of each frame
                ctx_f = ([mp[rep] for mp in ctx[0]], ctx[1][rep])
                target = target_frames[rows].reshape(-1, *target_frames.shape[2:])[flat]
                losses["frame"] = losses["frame"] + F.mse_loss(self.decode(zf, ctx_f), target)
                if self.unet is not None:
                    losses["diffusion"] = losses["diffusion"] + self.diffusion_loss(
                        target, zf, ctx_f, generator
                    )
        c = self.cfg
        total = (
            c.frame_weight * (losses["frame"] + losses["diffusion"])
            + c.state_weight * losses["state"]
            + c.outcome_weight * (losses["progress"] + losses["success"])
        ) / n_members
        return total, {
            f"wm/loss_{k}": float(v.detach() if torch.is_tensor(v) else v) / n_members
            for k, v in losses.items()
        }

    def grounded_loss(
        self, batch: dict[str, torch.Tensor], member_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict]:
        """Loss of the grounded heads (``outcome_input="state"``) on windows that may span whole
        episodes (only their first frame is read: ``images`` ``[B, 1 or H+1, 3, h, w]``; the other
        keys as :meth:`loss`, with ``goal`` and ``tip0`` ``[B, 2]``).

        - ``state``: the state rolled open-loop from the window's first real state (with zero memory,
          as at an episode's start, where the hand's target is the hand: train on windows from the
          start, ``sample_windows(from_start=True)``) against the real states, absolute error in
          centimetres, mean over dimensions (bounded gradients: the squared error in centimetres
          of an untrained 50-step rollout is in the thousands);
        - ``progress`` / ``success``: squared error and cross-entropy of the outcome heads both on the
          rolled state (what scoring uses) and on the real state (teacher forcing: every real step
          labels the outcome function itself, whatever the rollout's drift).
        """
        imgs, sts, acts = batch["images"], batch["states"], batch["actions"]
        b, h = acts.shape[:2]
        z0, _ = self.observe(imgs[:, 0], sts[:, 0], batch.get("instr"))
        # a window's tip0 is its episode's first hand xy, not the window's
        ground = self.grounding(z0, sts[:, 0], batch["goal"], batch.get("instr"))
        ground = ground._replace(tip0=batch["tip0"].float().to(z0.device))
        step_mask = batch["step_mask"].float()
        known = batch["frame_mask"].float() * step_mask  # the real next state is known
        losses = {"state": 0.0, "progress": 0.0, "success": 0.0}
        for j, gm in enumerate(self.grounded):
            rows = _member_rows(member_ids, j, b, z0.device)
            if rows.numel() == 0:
                continue
            g_rows = ground.rows(rows)
            rolled, p_roll, l_roll = gm.roll(sts[rows, 0].float(), acts[rows], g_rows)  # [b_j, H, .]
            real_next = sts[rows, 1:].float()  # [b_j, H, S]
            p_tf, l_tf = gm.outcome_of(real_next.flatten(0, 1), g_rows.per_step(h))
            sm, km = step_mask[rows], known[rows]
            prog, succ = batch["progress"][rows].float(), batch["success"][rows].float()
            for p_k, l_k, mk in ((p_roll, l_roll, sm), (p_tf.view(-1, h), l_tf.view(-1, h), km)):
                denom = mk.sum().clamp(min=1)
                losses["progress"] = losses["progress"] + (((p_k - prog) ** 2) * mk).sum() / denom
                bce = F.binary_cross_entropy_with_logits(l_k, succ, reduction="none")
                losses["success"] = losses["success"] + (bce * mk).sum() / denom
            st_err = ((rolled - real_next) * 100).abs().mean(-1)
            losses["state"] = losses["state"] + (st_err * km).sum() / km.sum().clamp(min=1)
        c = self.cfg
        total = c.state_weight * losses["state"] + c.outcome_weight * (losses["progress"] + losses["success"])
        total = total / len(self.grounded)
        return total, {
            f"wm/grounded_loss_{k}": float(v.detach() if torch.is_tensor(v) else v) / len(self.grounded)
            for k, v in losses.items()
        }

    # ------------------------------------------------------------------ persistence
    def save(self, path) -> None:
        torch.save({"config": asdict(self.cfg), "state_dict": self.state_dict()}, path)

    @classmethod
    def load(cls, path) -> VLADynamics:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        model = cls(VLADynamicsConfig(**ckpt["config"]))
        model.load_state_dict(ckpt["state_dict"])
        return model


def _member_rows(member_ids: torch.Tensor | None, j: int, b: int, device) -> torch.Tensor:
    """The rows of a batch of ``b`` that member ``j`` trains on: all of them without ``member_ids``."""
    if member_ids is None:
        return torch.arange(b, device=device)
    return (member_ids.to(device) == j).nonzero().squeeze(-1)
