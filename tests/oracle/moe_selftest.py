#!/usr/bin/python3
"""Tests of the oracle's mixture-of-experts layer (torch_moe.py, through torch_model.py).

selftest.py (CTest torch_oracle_selftest) runs these too; this file also runs alone. Constructed
cases check the discrete rules with values worked by hand (top-k ties, capacity drops, the bias
rule over two steps, the auxiliary loss); a one-expert MoE must equal the dense MLP; the auxiliary
loss's gradient is checked against finite differences; then config validation, parameter counts,
init and weight-decay groups. The forward pass against an independent loop reference, the full
objective's gradients and the CLI trajectories of MoE models are in selftest.py (CONFIGS).
"""

import math
import unittest

import numpy as np
import torch

from oracle_testutil import (CONFIGS, expected_contract, moe_cfg, random_model,  # noqa: E402
                             random_tokens, small_cfg)
import torch_model  # noqa: E402
import torch_moe  # noqa: E402

torch.set_num_threads(1)
F64 = torch.float64


def standalone_layer(router=None, seed=0, **moe_overrides):
    """A float64 llama-shaped MoE layer of width 4 on its own, random experts, router weight
    `router` [E, 4] (random when None), selection bias zero."""
    cfg = torch_model.normalize_config(
        moe_cfg("llama", moe_overrides, width=4, heads=2, kv_heads=2))
    layer = torch_moe.MoeLayer(cfg["family"], cfg["width"], cfg["moe"], 0,
                               lambda hidden: torch_model.Mlp(cfg, hidden)).double()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=F64))
        if router is not None:
            layer.router.weight.copy_(torch.as_tensor(router, dtype=F64))
    return layer


def rows(values):
    """x [1, N, C] from a list of rows."""
    return torch.tensor(values, dtype=F64).unsqueeze(0)


class TopKTest(unittest.TestCase):
    def test_select_experts_orders_by_value_then_lower_index(self):
        selection = torch.tensor([[0.1, 0.3, 0.3, 0.3],
                                  [0.5, 0.5, 0.5, 0.5],
                                  [0.2, 0.4, 0.1, 0.4],
                                  [-0.0, 0.0, -1.0, 0.0]], dtype=F64)
        self.assertEqual(torch_moe.select_experts(selection, 3).tolist(),
                         [[1, 2, 3], [0, 1, 2], [1, 3, 0], [0, 1, 3]])
        self.assertEqual(torch_moe.select_experts(selection, 1).tolist(), [[1], [0], [1], [0]])

    def test_group_limited_routing_by_hand(self):
        # Six experts in three groups of two: row 0's groups sum to 1.0, 1.5 and 1.4, so its best
        # expert (0) is in the worst group; row 1's groups tie and the lower ones are kept.
        selection = torch.tensor([[0.9, 0.1, 0.75, 0.75, 0.8, 0.6],
                                  [0.5, 0.5, 0.5, 0.5, 0.5, 0.5]], dtype=F64)
        pick = torch_moe.select_experts
        self.assertEqual(pick(selection, 2).tolist(), [[0, 4], [0, 1]])
        self.assertEqual(pick(selection, 2, 3, 3).tolist(), [[0, 4], [0, 1]])
        self.assertEqual(pick(selection, 2, 3, 1).tolist(), [[2, 3], [0, 1]])
        self.assertEqual(pick(selection, 2, 3, 2).tolist(), [[4, 2], [0, 1]])
        # Scored by their best (DeepSeek-V2's): row 0's groups score 0.9, 0.75 and 0.8.
        self.assertEqual(pick(selection, 2, 3, 1, "max").tolist(), [[0, 1], [0, 1]])
        self.assertEqual(pick(selection, 2, 3, 2, "max").tolist(), [[0, 4], [0, 1]])

    def test_group_limited_routing_matches_the_tensor_form(self):
        # DeepSeek-V3's rule written with tensor ops (group scores from topk(2), the kept groups
        # from topk, the rest masked to -inf) agrees with the loop on untied random values.
        gen = torch.Generator().manual_seed(7)
        selection = torch.rand(64, 12, generator=gen, dtype=F64)
        for groups, kept, k in ((4, 1, 3), (4, 2, 4), (3, 2, 2), (6, 3, 5)):
            grouped = selection.view(64, groups, -1)
            best = grouped.topk(2, dim=-1).values.sum(dim=-1).topk(kept, dim=-1).indices
            mask = torch.zeros(64, groups, dtype=torch.bool).scatter(1, best, True)
            masked = grouped.masked_fill(~mask.unsqueeze(-1), float("-inf")).reshape(64, 12)
            want = masked.topk(k, dim=-1).indices
            with self.subTest(groups=groups, kept=kept):
                self.assertEqual(torch_moe.select_experts(selection, k, groups, kept).tolist(),
                                 want.tolist())
            # DeepSeek-V2's: a group's best value (max), the rest masked to 0 (scores positive).
            best = grouped.max(dim=-1).values.topk(kept, dim=-1).indices
            mask = torch.zeros(64, groups, dtype=torch.bool).scatter(1, best, True)
            want = grouped.masked_fill(~mask.unsqueeze(-1), 0.0).reshape(64, 12).topk(k).indices
            with self.subTest(groups=groups, kept=kept, group_score="max"):
                self.assertEqual(
                    torch_moe.select_experts(selection, k, groups, kept, "max").tolist(),
                    want.tolist())

    def test_tie_made_by_the_selection_bias(self):
        # A zero router makes every softmax score exactly 1/4; the bias then ties experts 1 and 2
        # (0.25 + 0.25 = 0.5 exactly) above experts 0 and 3, which tie at 0.25.
        layer = standalone_layer(router=torch.zeros(4, 4), top_k=3, balance="bias",
                                 normalize_top_k=True, shared_experts=0)
        with torch.no_grad():
            layer.selection_bias.copy_(torch.tensor([0.0, 0.25, 0.25, 0.0], dtype=F64))
            x = rows([[0.3, -1.0, 2.0, 0.5], [1.0, 0.0, 0.0, -2.0]])
            y, routing = layer(x)
            self.assertEqual(routing.counts.tolist(), [2, 2, 2, 0])
            # Picks 1, 2, 0 for both tokens, each weighed 1/4 / (3/4) = 1/3 (unbiased scores).
            want = sum(layer.experts(e, x[0]) for e in (1, 2, 0)) / 3
            torch.testing.assert_close(y[0], want, rtol=1e-14, atol=1e-14)

    def test_ties_without_bias_take_the_lowest_experts(self):
        layer = standalone_layer(router=torch.zeros(4, 4), top_k=2, shared_experts=0)
        with torch.no_grad():
            _, routing = layer(rows([[1.0, 2.0, 3.0, 4.0]] * 3))
        self.assertEqual(routing.counts.tolist(), [3, 3, 0, 0])


class CapacityTest(unittest.TestCase):
    def test_capacity_formula(self):
        self.assertIsNone(torch_moe.expert_capacity(0.0, 14, 2, 4))
        self.assertEqual(torch_moe.expert_capacity(1.0, 5, 2, 4), 3)  # ceil(2.5)
        self.assertEqual(torch_moe.expert_capacity(1.0, 8, 2, 4), 4)  # exact: no rounding up
        self.assertEqual(torch_moe.expert_capacity(1.25, 14, 2, 4), 9)  # ceil(8.75)
        self.assertEqual(torch_moe.expert_capacity(0.01, 3, 1, 8), 1)  # never below one

    def test_drops_in_token_order_then_pick_order(self):
        # Router = identity, so a token's router logits are its row. Picks (top 2, highest first):
        # t0 [0,1], t1 [1,0], t2 [0,2], t3 [0,1], t4 [1,3]; capacity ceil(1.0*5*2/4) = 3.
        # Expert 0 takes t0, t1, t2 and is full when t3 asks first; expert 1 takes t0, t1, t3 and
        # is full when t4 asks first. So t3 keeps only expert 1, t4 only expert 3: 2 drops.
        layer = standalone_layer(router=torch.eye(4), top_k=2, capacity_factor=1.0,
                                 normalize_top_k=False, shared_experts=0)
        x = rows([[3, 2, 0, -1], [2, 3, 0, -1], [3, 0, 2, -1], [3, 2, 0, -1], [0, 3, -1, 2]])
        with torch.no_grad():
            y, routing = layer(x)
            self.assertEqual(routing.counts.tolist(), [4, 4, 1, 1])  # before drops
            self.assertEqual(routing.dropped, 2)
            kept = [[0, 1], [1, 0], [0, 2], [1], [3]]
            for t, experts in enumerate(kept):
                g = torch.softmax(x[0, t], dim=-1)
                want = sum(g[e] * layer.experts(e, x[0, t:t + 1])[0] for e in experts)
                torch.testing.assert_close(y[0, t], want, rtol=1e-14, atol=1e-14,
                                           msg="token %d" % t)

    def test_apply_capacity_directly(self):
        picks = torch.tensor([[0, 1], [1, 0], [0, 2], [0, 1], [1, 3]])
        keep, dropped = torch_moe.apply_capacity(picks, 4, 3)
        self.assertEqual(keep.tolist(), [[True, True], [True, True], [True, True], [False, True],
                                         [False, True]])
        self.assertEqual(dropped, 2)
        keep, dropped = torch_moe.apply_capacity(picks, 4, None)
        self.assertTrue(bool(keep.all()))
        self.assertEqual(dropped, 0)


class BiasRuleTest(unittest.TestCase):
    def test_two_steps_worked_by_hand(self):
        # Router = identity, top 1, rate 0.5. Softmax scores of a row with one 1 and three 0s:
        # e/(e+3) ~ 0.475 for that expert, 1/(e+3) ~ 0.175 for the others.
        # Step 1, bias 0: picks 0, 0, 1, 2 -> loads [2,1,1,0], mean 1, sign(mean - load)
        #   = [-1, 0, 0, +1] -> bias [-0.5, 0, 0, 0.5].
        # Step 2: every token's best is expert 3 (0.175 + 0.5 beats 0.475 + 0 and 0.475 - 0.5)
        #   -> loads [0,0,0,4], sign = [+1, +1, +1, -1] -> bias [0, 0.5, 0.5, 0].
        layer = standalone_layer(router=torch.eye(4), top_k=1, balance="bias",
                                 bias_update_rate=0.5, shared_experts=0, normalize_top_k=False)
        x = rows([[1, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]])
        with torch.no_grad():
            _, routing = layer(x)
            self.assertEqual(routing.counts.tolist(), [2, 1, 1, 0])
            layer.update_selection_bias(routing.counts)
            self.assertEqual(layer.selection_bias.tolist(), [-0.5, 0.0, 0.0, 0.5])
            y, routing = layer(x)
            self.assertEqual(routing.counts.tolist(), [0, 0, 0, 4])
            # The weight is the unbiased score of expert 3: 1/(e+3), not 1/(e+3) + 0.5.
            torch.testing.assert_close(y[0, 0], layer.experts(3, x[0, :1])[0] / (math.e + 3),
                                       rtol=1e-14, atol=1e-14)
            layer.update_selection_bias(routing.counts)
            self.assertEqual(layer.selection_bias.tolist(), [0.0, 0.5, 0.5, 0.0])

    def test_bias_is_in_the_contract_but_not_trained(self):
        cfg = CONFIGS["llama_moe_bias"]
        model = random_model(cfg, seed=3)
        name = "h.1.moe.router.bias"
        self.assertIn(name, dict(model.named_contract_parameters()))
        self.assertNotIn(name, dict(model.named_trainable_parameters()))
        bias = dict(model.named_contract_parameters())[name]
        self.assertFalse(bias.requires_grad)
        opt, _ = torch_model.make_optimizer(model, dict(cfg, steps=1))
        in_groups = [id(p) for g in opt.param_groups for p in g["params"]]
        self.assertNotIn(id(bias), in_groups)


class AuxLossTest(unittest.TestCase):
    def test_values_worked_by_hand(self):
        # Zero router: every softmax score is 1/4, every sigmoid score 1/2 (normalised: 1/4); all
        # tokens pick experts 0 and 1, so f = [1/2, 1/2, 0, 0], P = 1/4 each, and
        # L = coeff * 4 * (1/2 * 1/4 + 1/2 * 1/4) = coeff.
        for score in ("softmax", "sigmoid"):
            with self.subTest(score):
                layer = standalone_layer(router=torch.zeros(4, 4), top_k=2, score=score,
                                         aux_loss_coeff=0.3)
                _, routing = layer(rows([[1.0, -2.0, 0.5, 3.0]] * 5))
                self.assertAlmostEqual(routing.aux_loss.item(), 0.3, delta=1e-15)
        # Uneven: router = identity, rows [ln 2, 0, 0, 0] and [0, ln 2, 0, 0] have softmax scores
        # [2/5, 1/5, 1/5, 1/5] and [1/5, 2/5, 1/5, 1/5]; top 1 picks 0 and 1, f = [1/2, 1/2, 0, 0],
        # P = [3/10, 3/10, 1/5, 1/5]: L = 1.0 * 4 * 3/10 = 1.2.
        layer = standalone_layer(router=torch.eye(4), top_k=1, aux_loss_coeff=1.0)
        ln2 = math.log(2.0)
        _, routing = layer(rows([[ln2, 0, 0, 0], [0, ln2, 0, 0]]))
        self.assertAlmostEqual(routing.aux_loss.item(), 1.2, delta=1e-15)

    def test_counts_before_drops_feed_f(self):
        # With capacity 1 of 2 tokens both picking expert 0, f still sees both picks.
        layer = standalone_layer(router=torch.zeros(4, 4), top_k=1, aux_loss_coeff=1.0,
                                 capacity_factor=1.0)
        _, routing = layer(rows([[1.0, 0, 0, 0], [0, 1.0, 0, 0]]))
        self.assertEqual((routing.counts.tolist(), routing.dropped), ([2, 0, 0, 0], 1))
        self.assertAlmostEqual(routing.aux_loss.item(), 1.0, delta=1e-15)  # 4 * (1 * 1/4)

    def test_no_aux_loss_under_bias_balance(self):
        layer = standalone_layer(top_k=2, balance="bias", aux_loss_coeff=0.5)
        _, routing = layer(rows([[1.0, 2.0, 3.0, 4.0]]))
        self.assertEqual(routing.aux_loss.item(), 0.0)

    def test_router_z_loss_worked_by_hand(self):
        # A zero router gives every token logits of zero: log-sum-exp ln 4 over 4 experts, so the
        # router z-loss is 0.1 * (ln 4)^2 under either rule (the bias rule's only auxiliary loss),
        # and its gradient on the router's logits is 0.1 * 2 * ln 4 * softmax / tokens.
        for balance in ("aux_loss", "bias"):
            layer = standalone_layer(router=torch.zeros(4, 4), top_k=1, balance=balance,
                                     aux_loss_coeff=0.0 if balance == "aux_loss" else 0.01,
                                     z_loss_coeff=0.1)
            logits = torch.zeros(3, 4, dtype=F64, requires_grad=True)
            self.assertAlmostEqual(layer.z_loss(logits).item(), 0.1 * math.log(4) ** 2,
                                   delta=1e-15)
            layer.z_loss(logits).backward()
            np.testing.assert_allclose(logits.grad.numpy(),
                                       np.full((3, 4), 0.1 * 2 * math.log(4) * 0.25 / 3),
                                       rtol=1e-12)
            if balance == "bias":
                _, routing = layer(rows([[1.0, 2.0, 3.0, 4.0]]))
                self.assertAlmostEqual(routing.aux_loss.item(), 0.1 * math.log(4) ** 2,
                                       delta=1e-15)

    def test_gradient_matches_finite_differences(self):
        # d(sum of L_aux)/d(parameters) alone: through the routers and, via the routers' inputs,
        # every tensor upstream of an MoE layer (earlier blocks' experts too); the last block's
        # experts, which no router reads, get none.
        for label in ("gpt2_moe", "gpt2_moe_capacity", "llama_moe"):
            with self.subTest(label):
                cfg = CONFIGS[label]
                model = random_model(cfg, seed=20)
                tokens = random_tokens(cfg, 2, 6, seed=21)
                targets = random_tokens(cfg, 2, 6, seed=22)

                def aux():
                    return model.objective(tokens, targets).aux_loss

                model.zero_grad()
                aux().backward()
                gen = torch.Generator().manual_seed(23)
                h = 1e-6
                router_grad = 0.0
                for name, p in model.named_trainable_parameters():
                    last = "h.%d." % (cfg["layers"] - 1)
                    if name.startswith(last) and (".experts." in name or ".shared." in name):
                        self.assertTrue(p.grad is None or not p.grad.any(), name)
                        continue
                    if name.endswith("router.w"):
                        router_grad = max(router_grad, p.grad.abs().max().item())
                        picks = range(p.numel())
                    else:
                        picks = torch.randint(0, p.numel(), (2,), generator=gen).tolist()
                    flat = p.data.view(-1)
                    for i in picks:
                        old = flat[i].item()
                        with torch.no_grad():
                            flat[i] = old + h
                            up = aux().item()
                            flat[i] = old - h
                            down = aux().item()
                            flat[i] = old
                        numeric = (up - down) / (2 * h)
                        analytic = 0.0 if p.grad is None else p.grad.view(-1)[i].item()
                        self.assertAlmostEqual(analytic, numeric, delta=1e-9 + 1e-6 * abs(numeric),
                                               msg="%s[%d]" % (name, i))
                self.assertGreater(router_grad, 1e-4)


class DenseEquivalenceTest(unittest.TestCase):
    """One expert, top 1, no shared experts, no aux loss: the weight is exactly 1 (softmax of one
    score, or a sigmoid score normalised by itself), so the MoE layer is the dense MLP."""

    def test_single_expert_equals_dense_mlp(self):
        for family, score, normalize in (("gpt2", "softmax", False), ("llama", "sigmoid", True),
                                         ("llama", "softmax", False)):
            with self.subTest((family, score)):
                dense_cfg = small_cfg(family)
                cfg = moe_cfg(family, {"experts": 1, "top_k": 1, "shared_experts": 0,
                                       "ffn": dense_cfg["ffn_hidden"], "score": score,
                                       "normalize_top_k": normalize, "aux_loss_coeff": 0.0})
                dense = random_model(dense_cfg, seed=30)
                moe = random_model(cfg, seed=31)  # keeps its random router
                params = dict(moe.named_contract_parameters())
                to_moe = {}
                with torch.no_grad():
                    for name, p in dense.named_contract_parameters():
                        target = name.replace(".mlp.", ".moe.experts.")
                        to_moe[name] = target
                        params[target].copy_(p.view(params[target].shape))
                tokens = random_tokens(cfg, 2, 7, seed=32)
                targets = random_tokens(cfg, 2, 7, seed=33)
                want = dense.objective(tokens, targets)
                got = moe.objective(tokens, targets)
                want.objective.backward()
                got.objective.backward()
                torch.testing.assert_close(got.logits, want.logits, rtol=1e-12, atol=1e-12)
                self.assertEqual(got.aux_loss.item(), 0.0)
                for name, p in dense.named_contract_parameters():
                    torch.testing.assert_close(params[to_moe[name]].grad.view(p.shape), p.grad,
                                               rtol=1e-12, atol=1e-12, msg=name)
                for l in range(cfg["layers"]):
                    router = params["h.%d.moe.router.w" % l]
                    self.assertLessEqual(router.grad.abs().max().item(), 1e-12)


class MoeConfigTest(unittest.TestCase):
    def test_validation(self):
        bad = [
            ({"top_k": 0}, "moe.top_k"), ({"top_k": 5}, "moe.top_k"), ({"every": 0}, "moe.every"),
            ({"every": 3}, "moe.every"), ({"ffn": 0}, "moe.ffn"),
            ({"shared_experts": -1}, "moe.shared_experts"), ({"experts": -1}, "moe.experts"),
            ({"experts": 2.0}, "moe.experts"), ({"score": "relu"}, "moe.score"),
            ({"balance": "none"}, "moe.balance"), ({"normalize_top_k": 1}, "moe.normalize_top_k"),
            ({"aux_loss_coeff": -0.1}, "moe.aux_loss_coeff"),
            ({"bias_update_rate": 0}, "moe.bias_update_rate"),
            ({"capacity_factor": -1.0}, "moe.capacity_factor"),
            ({"capacity_factor": float("nan")}, "moe.capacity_factor"),
            ({"topk": 2}, "moe.topk"), ({"groups": 3}, "moe.groups"),
            ({"groups": 4}, "moe.groups"), ({"groups": 2, "group_top_k": 3}, "moe.group_top_k"),
            ({"top_k": 3, "groups": 2, "group_top_k": 1}, "moe.group_top_k"),
        ]
        for change, key in bad:
            with self.subTest(change):
                cfg = moe_cfg("gpt2", change)  # 2 layers, 4 experts
                with self.assertRaisesRegex(torch_model.ConfigError, key):
                    torch_model.normalize_config(cfg)
        with self.assertRaisesRegex(torch_model.ConfigError, "moe"):
            torch_model.normalize_config(small_cfg("gpt2", moe=[4]))
        # The limits themselves are valid.
        torch_model.normalize_config(moe_cfg("gpt2", {"top_k": 4, "every": 2, "ffn": 1}))

    def test_experts_zero_is_dense(self):
        dense = torch_model.build_model(small_cfg("llama"))
        for moe in ({"experts": 0}, {"experts": 0, "top_k": 9, "ffn": 0, "score": "other"}):
            model = torch_model.build_model(small_cfg("llama", moe=moe))
            self.assertEqual([(n, p.shape) for n, p in model.named_contract_parameters()],
                             [(n, p.shape) for n, p in dense.named_contract_parameters()])

    def test_moe_blocks_are_every_nth(self):
        cfg = torch_model.normalize_config(moe_cfg("gpt2", {"every": 2}, layers=5))
        self.assertEqual([torch_model.is_moe_layer(cfg, l) for l in range(5)],
                         [False, True, False, True, False])

    def test_parameter_count(self):
        # gpt2_moe: V 29, C 16, max_seq 12, 2 layers, qkv 3C, E 4, F 8, one shared expert, tied.
        V, C, T, L, E, F_, S = 29, 16, 12, 2, 4, 8, 1
        mlp = lambda f: f * C + f + C * f + C  # noqa: E731
        attention = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C
        moe = E * C + E * mlp(F_) + mlp(S * F_)
        model = torch_model.build_model(CONFIGS["gpt2_moe"])
        self.assertEqual(torch_model.parameter_count(model), V * C + T * C + 2 * C +
                         L * (attention + moe))
        # The selection bias is not counted.
        for label in ("llama_moe_bias", "llama_moe"):
            model = torch_model.build_model(CONFIGS[label])
            self.assertEqual(torch_model.parameter_count(model),
                             sum(math.prod(s) for n, s in expected_contract(CONFIGS[label])
                                 if not n.endswith("router.bias")))

    def test_init_and_decay_groups(self):
        model = torch_model.build_model(CONFIGS["gpt2_moe_capacity"]).double()
        bias_model = torch_model.build_model(CONFIGS["llama_moe_bias"]).double()
        torch_model.init_parameters(model, seed=1)
        torch_model.init_parameters(bias_model, seed=1)
        named = dict(model.named_contract_parameters())
        for name in ("h.1.moe.experts.fc.b", "h.1.moe.experts.proj.b"):
            self.assertFalse(named[name].any(), name)
        self.assertFalse(dict(bias_model.named_contract_parameters())["h.1.moe.router.bias"].any())
        proj_std = 0.02 / math.sqrt(2 * 2)
        self.assertAlmostEqual(named["h.1.moe.experts.proj.w"].std().item(), proj_std,
                               delta=0.2 * proj_std)
        self.assertAlmostEqual(named["h.1.moe.router.w"].std().item(), 0.02, delta=0.006)
        # Weights decay; biases do not, not even the experts' [E, C] proj.b.
        groups = torch_model.decay_groups(model, 0.1)
        decayed = {id(p) for p in groups[0]["params"]}
        self.assertNotIn(id(named["h.1.moe.experts.proj.b"]), decayed)
        self.assertNotIn(id(named["h.1.moe.experts.fc.b"]), decayed)
        self.assertIn(id(named["h.1.moe.router.w"]), decayed)


if __name__ == "__main__":
    unittest.main(verbosity=2)
