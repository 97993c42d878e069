"""Which package modules, tests and notebook each phase of the course has: the one table that
CONTRIBUTING.md shows (`python tests/phase_map.py` prints it) and that the pytest markers use
(`pytest -m t05` runs T05's tests). tests/test_phase_map.py keeps the three in step."""

PHASES = {
    "T00": ("welcome", ["course/checks.py", "course/deps.py", "course/notebooks.py", "course/doctor.py",
                        "cli/main.py", "cli/errors.py", "cli/notebooks.py", "cli/doctor.py"],
            ["test_course.py", "test_mutants.py", "test_notebook_pipeline.py", "test_doctor.py", "test_cli.py",
             "test_packaging.py", "test_book.py", "test_layers.py", "test_phase_map.py"]),
    "T01": ("devices_and_kernels", ["runtime/device.py", "runtime/cuda/", "runtime/kernels/vector_add.py"],
            ["test_device.py", "test_cuda_emulator.py", "test_nvcc_compile.py", "test_nvrtc_compile.py",
             "test_emulator_features.py", "test_emulator_sanitizer.py", "test_fake_cupy.py"]),
    "T02": ("tensors", ["runtime/kernels/elementwise.py", "runtime/kernels/transpose.py",
                        "runtime/kernels/embedding.py"], ["test_kernels_t02.py"]),
    "T03": ("gemm", ["runtime/kernels/gemm.py"], ["test_kernels_gemm.py"]),
    "T04": ("autograd", ["autograd/tensor.py", "autograd/ops.py", "autograd/gradcheck.py"],
            ["test_autograd.py", "test_gradcheck.py", "test_ops_torch_parity.py"]),
    "T05": ("transformer", ["model/layers.py", "model/qwen3.py"], ["test_model_parity.py"]),
    "T05b": ("bpe_tokenizer", ["training/bpe_pretokenize.py", "training/bpe_train.py", "training/bpe_tokenizer.py",
                               "training/bpe_hf.py", "measure/bench_tokenizer.py"], ["test_bpe.py"]),
    "T06": ("training", ["training/config.py", "training/loop.py", "training/deferred.py",
                         "training/optim.py", "training/schedule.py", "training/data.py",
                         "training/fetch.py", "training/tokenizer.py", "training/checkpoint.py",
                         "training/rundir.py", "training/metrics.py", "training/validation.py",
                         "model/generate.py", "cli/train.py", "cli/sample.py", "cli/data.py"],
            ["test_train.py", "test_cli_train.py", "test_optim.py", "test_schedule.py", "test_data.py",
             "test_data_fetch.py", "test_tokenizer.py", "test_checkpoint.py", "test_generate.py",
             "test_corpus.py", "test_faults.py"]),
    "T07": ("performance", ["runtime/cpu_threads.py", "runtime/blas.py", "runtime/host/fused_rows.py",
                            "model/causal_blocks.py",
                            "runtime/kernels/adamw.py", "training/fused_adamw.py",
                            "measure/bench.py", "measure/torch_twin.py", "measure/profiler.py", "cli/bench.py"],
            ["test_cpu_threads.py", "test_blas.py", "test_fused_rows.py", "test_profiler.py",
             "test_kernels_adamw.py"]),
    "T08": ("data_parallel", ["parallel/collectives.py", "parallel/ring.py", "parallel/ddp.py",
                              "measure/ddp_experiments.py"], ["test_distributed.py"]),
    "T09": ("export", ["interop/hf.py", "cli/export.py", "cli/import_hf.py"], ["test_export_hf.py"]),
    "T10": ("batching", ["model/batching.py"], ["test_batching.py"]),
    "T11": ("memory", ["runtime/allocator.py", "measure/memory_report.py"], ["test_memory.py"]),
    "T12": ("bf16", ["model/precision.py", "runtime/kernels/bf16.py", "training/grad_scaler.py"],
            ["test_amp.py", "test_kernels_bf16.py", "test_grad_scaler.py"]),
    "T13": ("recompute", ["model/recompute.py"], ["test_recompute.py"]),
    "T14": ("flash_attention", ["model/flash_attention.py", "runtime/kernels/flash_attention.py"],
            ["test_flash_attention.py"]),
    "T15": ("gqa", ["model/gqa.py"], ["test_gqa.py"]),
    "T16": ("grad_accumulation", ["parallel/ddp.py"], ["test_accumulation.py"]),
    "T17": ("launcher", ["parallel/launch.py", "cli/launch.py"], ["test_launcher.py", "test_faults_signals.py"]),
    "T18": ("dropout", ["model/dropout.py", "runtime/rng.py", "runtime/kernels/philox.py"],
            ["test_dropout.py", "test_rng.py"]),
    "T19": ("capstone", ["measure/evaluate.py", "measure/study.py", "measure/scaling_law.py",
                         "measure/study_plots.py", "cli/eval.py", "cli/study.py"],
            ["test_eval.py", "test_study.py", "test_mutants_T19.py"]),
    "T20": ("grpo", ["training/grpo.py", "training/rewards.py", "training/post_train.py", "cli/grpo.py", "measure/grpo_bench.py"],
            ["test_grpo.py", "test_mutants_T20.py"]),
}


def phases_of_test(filename: str) -> list[str]:
    return [p for p, (_, _, tests) in PHASES.items() if filename in tests]


def markdown_table() -> str:
    rows = ["| phase | notebook | package modules (`xtrain_lessons/…`) | tests (`tests/…`) |",
            "|---|---|---|---|"]
    for phase, (topic, modules, tests) in PHASES.items():
        rows.append(f"| {phase} | `{phase}_{topic}` | " + ", ".join(f"`{m}`" for m in modules)
                    + " | " + ", ".join(f"`{t}`" for t in tests) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
