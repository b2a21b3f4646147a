"""Mutation check: does the test suite fail when what a test names breaks?

    python tests/mutations.py                 # every mutation, one after another
    python tests/mutations.py --only=T1,O3    # some of them
    python tests/mutations.py --list

Each mutation is one textual change to one file. It is applied to a scratch copy of the tracked
tree (git ls-files, without study/results/), and the tests that should catch it run there
(`pytest -x`). A mutation is caught when those tests fail (pytest exit code 1); it survives
when they pass. Any other outcome (the change no longer applies, a collection error) is an error
of this script. One row per mutation; the exit code is non-zero unless every mutation is caught.
Not part of `.ci/run`: a full pass takes about 25 minutes on two CPU cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class Mutation:
    key: str
    what: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


XLA_CONTEXT = (
    '__import__("tensorflow.python.ops.control_flow_util", fromlist=["_"])'
    ".GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())"
)

MUTATIONS = [
    # The table of issue "Tests that fail when what they name breaks".
    Mutation(
        "T1",
        "Fast-BAT drops its implicit term whenever the step is compiled with XLA",
        "fbat_tf/methods/fast_bat.py",
        "grads.append(upper + self.ig_coef * implicit)",
        f"grads.append(upper + (0.0 if {XLA_CONTEXT} else self.ig_coef) * implicit)",
        (
            "tests/test_fastbat_reference.py::test_xla_step_matches_reference_and_keeps_the_implicit_term",
        ),
    ),
    Mutation(
        "T2",
        "weight decay without the loss scale",
        "fbat_tf/trainer.py",
        "tf.cast(self.weight_decay * loss_scale, g.dtype)",
        "tf.cast(self.weight_decay, g.dtype)",
        (
            "tests/test_trainer.py::test_weight_decay_is_scaled_with_the_loss",
            "tests/test_trainer.py::test_loss_scaled_step_equals_the_unscaled_step",
        ),
    ),
    Mutation(
        "T3",
        "loss_scale=None passed to the method (under mixed_float16)",
        "fbat_tf/trainer.py",
        "grads, logs = self._gradients(x, y, self.step_seed(), loss_scale, *indices)",
        "grads, logs = self._gradients(x, y, self.step_seed(), None, *indices)",
        (
            "tests/test_trainer.py::test_the_method_receives_the_dynamic_loss_scale_under_mixed_float16",
        ),
    ),
    Mutation(
        "T4",
        "a step seed that ignores the iteration",
        "fbat_tf/trainer.py",
        "tf.stack([tf.constant(self.seed, tf.int64), tf.identity(self.seed_counter)])",
        "tf.stack([tf.constant(self.seed, tf.int64), tf.constant(0, tf.int64)])",
        ("tests/test_trainer.py::test_each_step_draws_from_its_own_seed_and_the_run_seed_matters",),
    ),
    Mutation(
        "T5a",
        "PGD-AT's steps go down the loss",
        "fbat_tf/methods/pgd_at.py",
        "fgsm_step(model, x, delta, y, self.eps, self.alpha, loss_scale, self.norm)",
        "fgsm_step(model, x, delta, y, self.eps, -self.alpha, loss_scale, self.norm)",
        ("tests/test_methods.py::test_pgd_at_is_k_signed_ascent_steps_from_the_random_start",),
    ),
    Mutation(
        "T5b",
        "Free-AT's δ update goes down the loss",
        "fbat_tf/methods/free_at.py",
        "delta + self.alpha * tf.sign(delta_grad)",
        "delta - self.alpha * tf.sign(delta_grad)",
        ("tests/test_methods.py::test_free_at_steps_delta_up_its_own_gradient_across_replays",),
    ),
    Mutation(
        "T6",
        "PGD keeps the last restart instead of the first that breaks an example",
        "fbat_tf/attacks/pgd.py",
        "take = tf.logical_or(tf.logical_and(robust, broken), tf.equal(index, 0))",
        "take = tf.ones_like(robust)",
        ("tests/test_attacks.py::test_pgd_keeps_per_example_the_first_restart_that_breaks_it",),
    ),
    Mutation(
        "T7a",
        "APGD without step-size halving",
        "fbat_tf/attacks/apgd.py",
        "step_size = tf.where(halve, state.step_size / 2.0, state.step_size)",
        "step_size = tf.where(halve, state.step_size, state.step_size)",
        (
            "tests/test_apgd.py::test_apgd_step_sizes_follow_a_numpy_transcription_of_the_reference_loop",
        ),
    ),
    Mutation(
        "T7b",
        "APGD without momentum",
        "fbat_tf/attacks/apgd.py",
        "tf.where(i > 0, _MOMENTUM, 1.0)",
        "tf.where(i > 0, 1.0, 1.0)",
        (
            "tests/test_apgd.py::test_apgd_step_sizes_follow_a_numpy_transcription_of_the_reference_loop",
        ),
    ),
    Mutation(
        "T8",
        "AutoAttack standard runs APGD-CE only (FAB-T and Square never called)",
        "fbat_tf/attacks/autoattack.py",
        "            still_robust = np.flatnonzero(robust)\n",
        '            still_robust = np.flatnonzero(robust if name == "apgd-ce" else 0 * robust)\n',
        (
            "tests/test_autoattack.py::test_standard_version_runs_each_attack_on_what_the_previous_ones_left",
        ),
    ),
    Mutation(
        "T9a",
        "the overfitting guard without its fixed-batch clause",
        "fbat_tf/callbacks.py",
        "            or (\n                fixed_robust < self.fixed_best - self.drop",
        "            or False and (\n                fixed_robust < self.fixed_best - self.drop",
        ("tests/test_callbacks.py",),
    ),
    Mutation(
        "T9c",
        "the overfitting guard without its FGSM-against-PGD clause",
        "fbat_tf/callbacks.py",
        "            or single_step > robust + self.masking_gap",
        "            or False",
        ("tests/test_callbacks.py",),
    ),
    Mutation(
        "T9b",
        'the guard "warns" without a warning',
        "fbat_tf/callbacks.py",
        "            logging.warning(\n"
        '                "epoch %d: catastrophic overfitting suspected',
        '            logging.info(\n                "epoch %d: catastrophic overfitting suspected',
        ("tests/test_callbacks.py",),
    ),
    Mutation(
        "T10",
        "a non-chief worker writes into the workdir",
        "fbat_tf/training.py",
        "        if distribute.is_chief(strategy):\n            return _train(config, strategy)",
        "        if True:\n            return _train(config, strategy)",
        (
            "tests/test_distribute.py::test_a_non_chief_worker_trains_without_writing_into_the_workdir",
        ),
    ),
    Mutation(
        "T11",
        "epoch-level TensorBoard scalars lost off the batch cadence",
        "fbat_tf/callbacks.py",
        "        with tf.summary.record_if(True):\n"
        "            super().on_epoch_end(epoch, renamed(_finite_logs(logs), self.names))",
        "        if True:\n"
        "            super().on_epoch_end(epoch, renamed(_finite_logs(logs), self.names))",
        ("tests/test_tensorboard.py",),
    ),
    Mutation(
        "T12",
        "a resumed run reads the data from the first epoch again",
        "fbat_tf/training.py",
        "built.stream(initial_epoch * built.steps_per_epoch),",
        "built.stream(0),",
        ("tests/test_resume.py",),
    ),
    # Our own: where a bug would cost a user most.
    Mutation(
        "O1",
        "the projection forgets the [0, 1] box",
        "fbat_tf/constraints.py",
        "    delta = tf.clip_by_value(delta, -eps, eps)\n"
        "    return tf.clip_by_value(delta, -x, 1.0 - x)",
        "    delta = tf.clip_by_value(delta, -eps, eps)\n    return delta",
        ("tests/test_methods.py::test_adversarial_examples_lie_in_C",),
    ),
    Mutation(
        "O2",
        "the inactive mask also counts coordinates on the lower bound",
        "fbat_tf/constraints.py",
        "inside = tf.logical_and(delta > lower, delta < upper)",
        "inside = tf.logical_and(delta >= lower - 2 * tau, delta < upper)",
        ("tests/test_methods.py::test_inactive_mask_against_a_brute_force_loop",),
    ),
    Mutation(
        "O3",
        "FGSM steps down the loss (a sign error in Fast-AT and GradAlign)",
        "fbat_tf/methods/base.py",
        "moved = delta + step_size * constraints.normalized(grad, norm)",
        "moved = delta - step_size * constraints.normalized(grad, norm)",
        ("tests/test_methods.py::test_fastat_is_one_fgsm_step_from_the_random_start",),
    ),
    Mutation(
        "O4",
        "Fast-BAT's lower level steps down its gradient",
        "fbat_tf/methods/fast_bat.py",
        "constraints.project(z + self.lambda_inv * lower_grad, x, self.eps)",
        "constraints.project(z - self.lambda_inv * lower_grad, x, self.eps)",
        ("tests/test_fastbat_reference.py::test_hessian_free_matches_reference",),
    ),
    Mutation(
        "O5",
        "the noise ignores its seed",
        "fbat_tf/constraints.py",
        "tf.shape(x), seed=seed, minval=-eps, maxval=eps, dtype=x.dtype",
        "tf.shape(x), seed=tf.constant([0, 0]), minval=-eps, maxval=eps, dtype=x.dtype",
        ("tests/test_fastbat_reference.py::test_seed_determines_the_step",),
    ),
    Mutation(
        "O6",
        "each replica draws the same noise",
        "fbat_tf/trainer.py",
        "stateless_fold_in(base, tf.cast(replica, tf.int64))",
        "stateless_fold_in(base, tf.cast(0, tf.int64))",
        (
            "tests/test_distribute.py::test_each_replica_draws_its_own_noise_and_the_step_matches_one_device",
        ),
    ),
    Mutation(
        "O7",
        "the export's uint8 signature forgets to divide by 255",
        "export/savedmodel.py",
        "return predictions(tf.cast(images, tf.float32) / 255.0)",
        "return predictions(tf.cast(images, tf.float32))",
        ("tests/test_export.py::test_uint8_signature_agrees_with_float",),
    ),
    Mutation(
        "O8",
        "the checkpoint leaves out the seed counter",
        "fbat_tf/callbacks.py",
        "            seed_counter=trainer.seed_counter,\n",
        "",
        (
            "tests/test_resume.py::test_a_resumed_run_ends_where_an_uninterrupted_one_does[fastat-3-options0-12]",
        ),
    ),
    Mutation(
        "O9",
        "the checkpoint leaves out Free-AT's δ",
        "fbat_tf/methods/free_at.py",
        'return {} if self.delta is None else {"delta": self.delta}',
        "return {}",
        (
            "tests/test_resume.py::test_a_resumed_run_ends_where_an_uninterrupted_one_does[free-4-options1-18]",
        ),
    ),
    Mutation(
        "O10",
        "the data stream started at a batch ignores the batches within the pass",
        "fbat_tf/data/pipeline.py",
        "    ds = ds.skip(start_batch % per_pass)\n    if not repeat:",
        "    if not repeat:",
        ("tests/test_data.py::test_pipeline_augmentation_and_shuffle_follow_the_seed",),
    ),
    Mutation(
        "O11",
        "attack losses scaled by the full loss scale (float16 overflow)",
        "fbat_tf/methods/base.py",
        "return tf.cast(loss_scale, tf.float32) / tf.cast(tf.shape(x)[0], tf.float32)",
        "return tf.cast(loss_scale, tf.float32)",
        (
            "tests/test_methods.py::test_attack_gradients_do_not_overflow_float16_at_the_weight_pass_scale",
        ),
    ),
    Mutation(
        "O12",
        "train.py's final evaluation runs the mixed-precision model",
        "fbat_tf/training.py",
        "record.final = evaluate_test(float32_classifier, config)",
        "record.final = evaluate_test(built.classifier, config)",
        (
            "tests/test_train_cli.py::test_final_evaluation_runs_the_float32_model_evaluate_py_loads",
        ),
    ),
    Mutation(
        "O13",
        "PGD evaluation steps leave the ε-ball",
        "fbat_tf/attacks/pgd.py",
        'if self.norm == "linf":  # one clip: P_C for the L∞ ball (delta_bounds)\n'
        "                    delta = tf.clip_by_value(moved, lower, upper)",
        'if self.norm == "linf":  # one clip: P_C for the L∞ ball (delta_bounds)\n'
        "                    delta = moved",
        ("tests/test_attacks.py",),
    ),
    Mutation(
        "O14",
        "Free-AT takes E/m passes of whole epochs (more gradient steps than promised)",
        "fbat_tf/training.py",
        "batches = math.ceil(config.epochs * steps_per_epoch / method.replays)",
        "batches = math.ceil(config.epochs / method.replays) * steps_per_epoch",
        (
            "tests/test_resume.py::test_a_resumed_run_ends_where_an_uninterrupted_one_does[free-4-options1-18]",
        ),
    ),
    Mutation(
        "O15",
        "evaluate gives AutoAttack each batch on its own, not the pooled batches",
        "fbat_tf/evaluation.py",
        "self.capacity = POOL_BYTES if _pools(attack) else 0",
        "self.capacity = 0",
        ("tests/test_autoattack.py::test_evaluate_gives_autoattack_the_survivors_of_all_batches",),
    ),
    Mutation(
        "O16",
        "AutoAttack's parts attack every survivor in one call, whatever the batch size",
        "fbat_tf/attacks/autoattack.py",
        "size = max(self.batch_size or n, 1)",
        "size = max(n, 1)",
        ("tests/test_autoattack.py",),
    ),
    Mutation(
        "O17",
        "a batch is skipped for a non-finite loss only (not its gradients or statistics)",
        "fbat_tf/trainer.py",
        '_all_finite([logs["loss"], *grads, *state])',
        '_all_finite([logs["loss"]])',
        (
            "tests/test_trainer.py::test_a_finite_loss_with_infinite_moving_variance_is_skipped",
            "tests/test_trainer.py::test_nan_gradients_under_a_finite_loss_are_skipped",
        ),
    ),
    Mutation(
        "O18",
        "a skipped batch leaves the loss scale where it was",
        "fbat_tf/trainer.py",
        "if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):",
        "if False:",
        ("tests/test_trainer.py::test_the_loss_scale_comes_down_when_the_attack_pass_overflows",),
    ),
    Mutation(
        "O19",
        "an ensemble's per-part outcomes land on other examples of the pool (counts unchanged)",
        "fbat_tf/evaluation.py",
        "            outcomes[part] = mask\n",
        "            outcomes[part] = mask[::-1]\n",
        ("tests/test_outcomes.py::test_each_point_has_its_own_outcome_in_dataset_order",),
    ),
    Mutation(
        "O20",
        "a replica's outcomes are placed where it holds them, not where the dataset does",
        "fbat_tf/tally.py",
        "where = tf.expand_dims(tf.cast(positions, tf.int64) - start, 1)",
        "where = tf.expand_dims(tf.range(tf.size(positions, out_type=tf.int64)), 1)",
        (
            "tests/test_evaluate_distribute.py::test_mirrored_evaluation_counts_what_one_device_counts",
        ),
    ),
    Mutation(
        "P1",
        "a paired comparison calls a side ahead when its 90 % interval excludes zero",
        "study/paired.py",
        "    if p < ALPHA:",
        "    if p < 2 * ALPHA:",
        ("tests/test_paired.py",),
    ),
    Mutation(
        "P2",
        "equivalence judged from the mean alone, not its 90 % interval",
        "study/paired.py",
        "    if p_equivalence < ALPHA:",
        "    if -margin < mean < margin:",
        ("tests/test_paired.py",),
    ),
    Mutation(
        "P3",
        "equivalence judged from the 95 % interval (one-sided tests at 2.5 % each), not the 90 %",
        "study/paired.py",
        "    if p_equivalence < ALPHA:",
        "    if p_equivalence < ALPHA / 2:",
        (
            "tests/test_paired.py::test_equivalent_when_the_90_interval_is_inside_the_margin_though_the_95_is_not",
        ),
    ),
    Mutation(
        "P4",
        "a report's verdicts from the uncorrected p-values, not Holm's",
        "study/paired.py",
        "found.verdict = verdict_of(found)",
        "found.verdict = found.raw_verdict",
        (
            "tests/test_paired.py::test_holm_s_correction_takes_the_verdicts_from_the_adjusted_p_values",
        ),
    ),
    Mutation(
        "P7",
        "a verdict over seeds × images from the crossed model alone, not with the seeds-only one",
        "study/paired.py",
        "analyses = [found, *([found.seeds_only] if found.seeds_only else [])]",
        "analyses = [found]",
        (
            "tests/test_paired.py::test_clipped_components_narrow_the_interval_and_do_not_make_a_verdict_alone",
        ),
    ),
    Mutation(
        "P8",
        "the seeds-only analyses left out of Holm's correction",
        "study/paired.py",
        "    for analyses in (alone, family):",
        "    for analyses in (family,):",
        ("tests/test_paired.py::test_the_seeds_only_analyses_are_a_family_of_their_own",),
    ),
    Mutation(
        "P5",
        "the comparisons with the most robust variant left out of Holm's family",
        "study/comparisons.py",
        "one_each = [same[0] for same in hypotheses.values()]",
        "one_each = [same[0] for same in hypotheses.values() if same[0] in listed]",
        (
            "tests/test_sweep.py::test_robustness_against_cost_prices_passes_and_names_the_cheapest_shown_equivalent",
        ),
    ),
    Mutation(
        "P6",
        "a pair both listed and against the most robust, the other way round, counted twice",
        "study/comparisons.py",
        "hypotheses.setdefault((pair.eps, frozenset((pair.a, pair.b))), []).append(pair)",
        "hypotheses.setdefault((pair.eps, pair.a, pair.b), []).append(pair)",
        (
            "tests/test_sweep.py::test_robustness_against_cost_prices_passes_and_names_the_cheapest_shown_equivalent",
        ),
    ),
    Mutation(
        "K1",
        "the masking check triggers at a gap equal to its threshold",
        "fbat_tf/attacks/masking.py",
        "gap > Fraction(repr(float(threshold)))",
        "gap >= Fraction(repr(float(threshold)))",
        (
            "tests/test_masking_check.py::test_the_trigger_is_more_than_the_threshold_in_points_compared_exactly",
        ),
    ),
    Mutation(
        "K2",
        "the checked accuracy is the lower of the two even where per-point outcomes exist",
        "fbat_tf/sweeps/masking.py",
        'return both.count("1") / len(both) if both else 0.0, PER_POINT',
        "return min(first.accuracy, second.accuracy), PER_POINT",
        ("tests/test_masking_check.py::test_a_point_is_robust_only_if_it_survived_both_attacks",),
    ),
    Mutation(
        "K3",
        "Square's restarts repeat the first search's draws",
        "fbat_tf/attacks/square.py",
        "restart_seed = tf.random.experimental.stateless_fold_in(seed, restart)",
        "restart_seed = seed",
        (
            "tests/test_square.py::test_square_restarts_break_at_least_what_one_search_breaks_and_stay_in_c",
        ),
    ),
    Mutation(
        "M1",
        "fbat_tf's max pooling uses Keras' kernel under XLA too",
        "fbat_tf/models/layers.py",
        "if not _compiled_by_xla():",
        "if True:",
        (
            "tests/test_models.py::test_max_pooling_is_keras_max_pooling_with_exact_second_derivatives_under_xla",
        ),
    ),
    Mutation(
        "E1",
        "ELLE's linear interpolation weighs the ends the wrong way round",
        "fbat_tf/methods/elle.py",
        "ce_c - ((1.0 - t) * ce_a + t * ce_b)",
        "ce_c - (t * ce_a + (1.0 - t) * ce_b)",
        ("tests/test_elle_reference.py::test_elle_matches_reference",),
    ),
    Mutation(
        "E2",
        "ELLE's triplet points through the model one batch each (batch norm sees each alone)",
        "fbat_tf/methods/elle.py",
        "logits = model(tf.concat([x_a, x_b, x_c], axis=0), training=True)",
        "logits = tf.concat([model(v, training=True) for v in (x_a, x_b, x_c)], axis=0)",
        ("tests/test_elle_reference.py::test_elle_matches_reference",),
    ),
    Mutation(
        "E3",
        "ELLE-A's jump needs only two earlier values",
        "fbat_tf/methods/elle.py",
        "jump = tf.logical_and(count > 2.0,",
        "jump = tf.logical_and(count > 1.0,",
        (
            "tests/test_elle_reference.py::test_elle_a_lambda_follows_the_released_rule_on_a_crafted_sequence",
        ),
    ),
    Mutation(
        "E4",
        "the trainer never hands a step's logs to the method (ELLE-A's λ stays put)",
        "fbat_tf/trainer.py",
        "self.method.after_gradients(logs)",
        "pass",
        ("tests/test_trainer.py::test_fit_with_xla_moves_elle_a_s_lambda_state_once_a_step",),
    ),
    # Each method's defaults: changed to a nearby value, a test fails.
    Mutation(
        "D1",
        "Fast-AT's step at ε, not the paper's 1.25ε",
        "fbat_tf/methods/fast_at.py",
        '1.25,\n        "Fast-AT FGSM step',
        '1.0,\n        "Fast-AT FGSM step',
        ("tests/test_methods.py::test_fastat_is_one_fgsm_step_from_the_random_start",),
    ),
    Mutation(
        "D2",
        "GradAlign's coefficient 0.25 at ε ≤ 8/255, not the authors' 0.2",
        "fbat_tf/methods/fast_at_ga.py",
        "    if eps <= low:\n        return 0.2\n",
        "    if eps <= low:\n        return 0.25\n",
        ("tests/test_methods.py::test_default_hyper_parameters_follow_the_paper",),
    ),
    Mutation(
        "D3",
        "GradAlign's coefficient 2.5 at ε ≥ 16/255, not the authors' 2.0",
        "fbat_tf/methods/fast_at_ga.py",
        "    if eps >= high:\n        return 2.0\n",
        "    if eps >= high:\n        return 2.5\n",
        ("tests/test_methods.py::test_default_hyper_parameters_follow_the_paper",),
    ),
    Mutation(
        "D4",
        "GradAlign's FGSM step at ε, not 1.25ε",
        "fbat_tf/methods/fast_at_ga.py",
        "self.alpha = 1.25 * self.eps if alpha is None",
        "self.alpha = 1.0 * self.eps if alpha is None",
        ("tests/test_methods.py::test_default_hyper_parameters_follow_the_paper",),
    ),
    Mutation(
        "D5",
        "N-FGSM's noise at 1.5ε, not the released 2ε",
        "fbat_tf/methods/n_fgsm.py",
        '2.0,\n        "N-FGSM noise',
        '1.5,\n        "N-FGSM noise',
        (
            "tests/test_methods.py::test_nfgsm_is_a_signed_step_of_eps_from_noise_of_twice_eps_without_projection",
        ),
    ),
    Mutation(
        "D6",
        "N-FGSM's step at 1.25ε, not the released ε",
        "fbat_tf/methods/n_fgsm.py",
        '1.0,\n        "N-FGSM signed step',
        '1.25,\n        "N-FGSM signed step',
        (
            "tests/test_methods.py::test_nfgsm_is_a_signed_step_of_eps_from_noise_of_twice_eps_without_projection",
        ),
    ),
    Mutation(
        "D7",
        "N-FGSM clips to 2ε by default, where the release does not clip",
        "fbat_tf/methods/n_fgsm.py",
        'None,\n        "N-FGSM: clip',
        '2.0,\n        "N-FGSM: clip',
        (
            "tests/test_methods.py::test_nfgsm_is_a_signed_step_of_eps_from_noise_of_twice_eps_without_projection",
        ),
    ),
    Mutation(
        "D8",
        "PGD-AT takes 3 steps by default, not 2",
        "fbat_tf/methods/pgd_at.py",
        'Option("steps", int, 2, "PGD-AT attack steps K."',
        'Option("steps", int, 3, "PGD-AT attack steps K."',
        ("tests/test_methods.py::test_pgd_step_size_defaults",),
    ),
    Mutation(
        "D9",
        "PGD-AT's step at ε/4 for K ≤ 2, not ε/2",
        "fbat_tf/methods/pgd_at.py",
        "self.alpha = self.eps / 2",
        "self.alpha = self.eps / 4",
        ("tests/test_methods.py::test_pgd_step_size_defaults",),
    ),
    Mutation(
        "D10",
        "PGD-AT's step at 2.5/255 for K > 2, not 2/255",
        "fbat_tf/methods/pgd_at.py",
        "self.alpha = 2.0 / 255 if",
        "self.alpha = 2.5 / 255 if",
        ("tests/test_methods.py::test_pgd_step_size_defaults",),
    ),
    Mutation(
        "D11",
        "Free-AT replays a batch 7 times by default, not 8",
        "fbat_tf/methods/free_at.py",
        'Option("replays", int, 8,',
        'Option("replays", int, 7,',
        ("tests/test_methods.py::test_default_hyper_parameters_follow_the_paper",),
    ),
    Mutation(
        "D12",
        "Free-AT's δ steps by 1.25ε, not ε",
        "fbat_tf/methods/free_at.py",
        "self.alpha = self.eps if alpha is None else float(alpha)",
        "self.alpha = 1.25 * self.eps if alpha is None else float(alpha)",
        ("tests/test_methods.py::test_free_at_steps_delta_up_its_own_gradient_across_replays",),
    ),
    Mutation(
        "D13",
        "Fast-BAT's a = 4000/255 at ε ≤ 8/255, not the paper's 5000/255",
        "fbat_tf/methods/fast_bat.py",
        "return 5000.0 / 255 if eps",
        "return 4000.0 / 255 if eps",
        ("tests/test_methods.py::test_default_hyper_parameters_follow_the_paper",),
    ),
    Mutation(
        "D14",
        "Fast-BAT's a = 3000/255 above 8/255, not the paper's 2500/255",
        "fbat_tf/methods/fast_bat.py",
        "else 2500.0 / 255",
        "else 3000.0 / 255",
        ("tests/test_methods.py::test_default_hyper_parameters_follow_the_paper",),
    ),
    Mutation(
        "D15",
        "Fast-BAT's c = 0.2, not the paper's 0.1",
        "fbat_tf/methods/fast_bat.py",
        '0.1,\n        "Fast-BAT implicit-gradient coefficient',
        '0.2,\n        "Fast-BAT implicit-gradient coefficient',
        ("tests/test_methods.py::test_default_hyper_parameters_follow_the_paper",),
    ),
    Mutation(
        "D16",
        "Hessian-aware Fast-BAT takes 2 conjugate-gradient steps by default, not 3",
        "fbat_tf/methods/fast_bat.py",
        '"cg_steps", int, 3,',
        '"cg_steps", int, 2,',
        ("tests/test_methods.py::test_default_hyper_parameters_follow_the_paper",),
    ),
    Mutation(
        "D17",
        "Fast-BAT linearizes at the signed PGD step by default, not the unsigned one",
        "fbat_tf/methods/fast_bat.py",
        '"pgd_nosign",\n        "Fast-BAT linearization point z."',
        '"pgd_sign",\n        "Fast-BAT linearization point z."',
        ("tests/test_methods.py::test_default_hyper_parameters_follow_the_paper",),
    ),
    Mutation(
        "D18",
        "the inactive mask's margin τ = 1e-6 in float32, not 1e-7",
        "fbat_tf/constraints.py",
        ".get(tf.as_dtype(dtype), 1e-7)",
        ".get(tf.as_dtype(dtype), 1e-6)",
        ("tests/test_methods.py::test_inactive_mask_against_a_brute_force_loop",),
    ),
    Mutation(
        "D19",
        "ELLE-A's λ_max = 3000, not the released 4000",
        "fbat_tf/methods/elle.py",
        "ADAPTIVE_LAMBDA_MAX = 4000.0",
        "ADAPTIVE_LAMBDA_MAX = 3000.0",
        ("tests/test_elle_reference.py::test_default_lambda_follows_the_released_scripts",),
    ),
    Mutation(
        "D20",
        "ELLE's fixed λ = 1500 at ε ≤ 8/255, not the released 1000",
        "fbat_tf/methods/elle.py",
        "        return 1000.0\n",
        "        return 1500.0\n",
        ("tests/test_elle_reference.py::test_default_lambda_follows_the_released_scripts",),
    ),
    Mutation(
        "D21",
        "ELLE-A's decay γ = 0.98, not the released 0.99",
        "fbat_tf/methods/elle.py",
        '0.99,\n        "ELLE-A: λ ← decay',
        '0.98,\n        "ELLE-A: λ ← decay',
        ("tests/test_elle_reference.py::test_default_lambda_follows_the_released_scripts",),
    ),
    Mutation(
        "D22",
        "ELLE-A's sensitivity s = 1 by default, not the released 2",
        "fbat_tf/methods/elle.py",
        '2.0,\n        "ELLE-A: a jump is',
        '1.0,\n        "ELLE-A: a jump is',
        (
            "tests/test_elle_reference.py::test_elle_a_lambda_follows_the_released_rule_on_a_crafted_sequence",
        ),
    ),
    Mutation(
        "D23",
        "ELLE's FGSM step at 0.75ε, not the released ε (from δ = 0 any step above ε is ε's)",
        "fbat_tf/methods/elle.py",
        "1.0,\n        \"ELLE's attack step",
        "0.75,\n        \"ELLE's attack step",
        ("tests/test_elle_reference.py::test_elle_matches_reference",),
    ),
    Mutation(
        "D24",
        "ELLE's N-FGSM point from noise of 1.5ε, not the released 2ε",
        "fbat_tf/methods/elle.py",
        "NFGSM_NOISE = 2.0",
        "NFGSM_NOISE = 1.5",
        (
            "tests/test_elle_reference.py::test_each_base_attack_and_elle_a_s_current_lambda_match_reference",
        ),
    ),
    Mutation(
        "E5",
        "ELLE-A's jump rule ignores s (one standard deviation, whatever s)",
        "fbat_tf/methods/elle.py",
        "error > mean + sensitivity * std",
        "error > mean + std",
        (
            "tests/test_elle_reference.py::test_elle_a_lambda_follows_the_released_rule_on_a_crafted_sequence",
        ),
    ),
    Mutation(
        "G1",
        "FGSM-PGI's λ at 9, not the released 10",
        "fbat_tf/methods/fgsm_pgi.py",
        "float,\n        10.0,",
        "float,\n        9.0,",
        (
            "tests/test_fgsm_pgi_reference.py::test_a_step_and_its_regularizer_match_the_closed_form_at_the_released_defaults",
        ),
    ),
    Mutation(
        "G2",
        "FGSM-PGI's momentum decay at 0.25, not the released 0.3",
        "fbat_tf/methods/fgsm_pgi.py",
        '0.3,\n        "FGSM-PGI momentum decay',
        '0.25,\n        "FGSM-PGI momentum decay',
        (
            "tests/test_fgsm_pgi_reference.py::test_a_step_and_its_regularizer_match_the_closed_form_at_the_released_defaults",
        ),
    ),
    Mutation(
        "G3",
        "FGSM-PGI's step at 1.25ε, not the released ε",
        "fbat_tf/methods/fgsm_pgi.py",
        '1.0,\n        "FGSM-PGI signed step',
        '1.25,\n        "FGSM-PGI signed step',
        (
            "tests/test_fgsm_pgi_reference.py::test_a_step_and_its_regularizer_match_the_closed_form_at_the_released_defaults",
        ),
    ),
    Mutation(
        "G4",
        "FGSM-PGI's prior restarts every 41 epochs, not the released 40",
        "fbat_tf/methods/fgsm_pgi.py",
        "40,\n        \"FGSM-PGI: each example's prior restarts",
        "41,\n        \"FGSM-PGI: each example's prior restarts",
        (
            "tests/test_fgsm_pgi_reference.py::test_a_step_and_its_regularizer_match_the_closed_form_at_the_released_defaults",
        ),
    ),
    Mutation(
        "G5",
        "FGSM-PGI's regularizer holds the logits at the prior constant",
        "fbat_tf/methods/fgsm_pgi.py",
        "gap = losses.as_loss_dtype(logits) - losses.as_loss_dtype(start_logits)",
        "gap = losses.as_loss_dtype(logits) - tf.stop_gradient(losses.as_loss_dtype(start_logits))",
        (
            "tests/test_fgsm_pgi_reference.py::test_a_step_and_its_regularizer_match_the_closed_form_at_the_released_defaults",
        ),
    ),
    Mutation(
        "G6",
        "FGSM-PGI's momentum normalizes each example's gradient, not the batch's",
        "fbat_tf/methods/fgsm_pgi.py",
        "tf.math.divide_no_nan(grad, tf.reduce_sum(tf.abs(grad)))",
        "tf.math.divide_no_nan(grad, tf.reduce_sum(tf.abs(grad), [1, 2, 3], keepdims=True))",
        (
            "tests/test_fgsm_pgi_reference.py::test_a_step_and_its_regularizer_match_the_closed_form_at_the_released_defaults",
        ),
    ),
    Mutation(
        "G7",
        "FGSM-PGI's next prior steps along the gradient, not the momentum",
        "fbat_tf/methods/fgsm_pgi.py",
        "start + self.alpha * tf.sign(momentum)",
        "start + self.alpha * tf.sign(grad)",
        (
            "tests/test_fgsm_pgi_reference.py::test_a_step_and_its_regularizer_match_the_closed_form_at_the_released_defaults",
        ),
    ),
    Mutation(
        "G8",
        "FGSM-PGI divides a zero gradient by its zero norm (NaN in the momentum)",
        "fbat_tf/methods/fgsm_pgi.py",
        "tf.math.divide_no_nan(grad, tf.reduce_sum(tf.abs(grad)))",
        "grad / tf.reduce_sum(tf.abs(grad))",
        (
            "tests/test_fgsm_pgi_reference.py::test_a_zero_input_gradient_adds_nothing_to_the_momentum",
        ),
    ),
    Mutation(
        "G9",
        "FGSM-PGI writes its rows during the step, before the trainer knows it is applied",
        "fbat_tf/methods/fgsm_pgi.py",
        '        self.pending["indices"].assign(indices)\n',
        '        self.pending["indices"].assign(indices)\n        self.commit()\n',
        (
            "tests/test_fgsm_pgi_reference.py::test_the_trainer_hands_over_the_batch_s_indices_and_writes_only_applied_rows",
        ),
    ),
    Mutation(
        "G10",
        "the trainer takes a batch's positions for its examples' indices",
        "fbat_tf/trainer.py",
        "(data[2] if len(data) > 2 else tf.range(tf.shape(x)[0], dtype=tf.int64),)",
        "(tf.range(tf.shape(x)[0], dtype=tf.int64),)",
        (
            "tests/test_fgsm_pgi_reference.py::test_the_trainer_hands_over_the_batch_s_indices_and_writes_only_applied_rows",
        ),
    ),
    Mutation(
        "G11",
        "the checkpoint leaves out FGSM-PGI's prior",
        "fbat_tf/methods/fgsm_pgi.py",
        """    def variables(self) -> dict[str, tf.Variable]:
        return dict(self.state)""",
        """    def variables(self) -> dict[str, tf.Variable]:
        return {}""",
        (
            "tests/test_resume.py::test_a_resumed_run_ends_where_an_uninterrupted_one_does[fgsm_pgi-2-options3-8]",
        ),
    ),
    Mutation(
        "G12",
        "train.py streams FGSM-PGI's training data without the examples' indices",
        "fbat_tf/training.py",
        "            with_indices=with_indices,\n",
        "            with_indices=False,\n",
        ("tests/test_train_cli.py::test_fgsm_pgi_trains_end_to_end_on_real_fashion_mnist",),
    ),
]


def scratch_copy(directory: str) -> str:
    """The tracked files of the tree (study/results/ left out) under `directory`."""
    files = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    tree = os.path.join(directory, "tree")
    for name in files:
        if (
            not name
            or name.startswith("study/results/")
            or not os.path.exists(os.path.join(ROOT, name))
        ):
            continue
        target = os.path.join(tree, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        source = os.path.join(ROOT, name)
        if os.path.islink(source):  # a tracked link (fbat_cli/configs) stays one, as in a clone
            os.symlink(os.readlink(source), target)
        else:
            shutil.copy2(source, target)
    return tree


def run(mutation: Mutation) -> tuple[str, float]:
    """Apply the mutation in a scratch copy and run its tests: 'caught', 'survived' or an
    error description; and the seconds it took."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fbat_mutation_") as directory:
        tree = scratch_copy(directory)
        path = os.path.join(tree, mutation.path)
        with open(path) as f:
            text = f.read()
        if text.count(mutation.old) != 1:
            return f"error: the change applies {text.count(mutation.old)} times", 0.0
        with open(path, "w") as f:
            f.write(text.replace(mutation.old, mutation.new))
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=tree)
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *mutation.tests],
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
        )
    seconds = time.perf_counter() - start
    if result.returncode == 1:
        return "caught", seconds
    if result.returncode == 0:
        return "survived", seconds
    return f"error: pytest exit code {result.returncode}: {result.stdout[-500:]}", seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="", help="comma-separated keys, e.g. T1,O3")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    args = parser.parse_args()
    keys = {m.key for m in MUTATIONS}
    only = [k for k in args.only.split(",") if k]
    unknown = sorted(set(only) - keys)
    if unknown:
        parser.error(f"unknown mutation keys {unknown}; known: {sorted(keys)}")
    chosen = [m for m in MUTATIONS if not only or m.key in only]
    if args.list:
        for m in chosen:
            print(f"{m.key:4} {m.path:32} {m.what}")
        return 0
    print("| mutation | change | tests | outcome | seconds |")
    print("|---|---|---|---|---|")
    failures = 0
    for m in chosen:
        outcome, seconds = run(m)
        failures += outcome != "caught"
        tests = ", ".join(t.removeprefix("tests/") for t in m.tests)
        print(f"| {m.key} | {m.what} | {tests} | {outcome} | {seconds:.0f} |", flush=True)
    print(f"\n{len(chosen) - failures} of {len(chosen)} mutations caught")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
