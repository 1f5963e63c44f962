"""Peers: what a user would run instead of our kernels, measured at batch 1 in this process.

``rungs`` (each peer an object, checked then timed: :func:`rungs.peer_rungs`), ``hf``
(transformers' ``generate``), ``oracle_step`` (the oracle's step, eager and compiled),
``gpt_fast`` (the step as gpt-fast writes it), ``launches`` (counting kernel launches),
``llama_cpp`` and ``llama_cpp_gguf`` (llama.cpp's llama-bench on a GGUF of the run's
weights); ``bench`` puts them beside our ladder on one prompt and one oracle run
(:func:`bench.bench_rows`, ``python -m onelaunch bench``).

Four peers, each checked against the eager oracle over the same prompt, then timed per
decode token at context ``ctx``; and llama.cpp, timed by its own llama-bench, which
prints no logits and so cannot be checked (its row says so). The check is the one our rungs pass
(:mod:`onelaunch.measure.agree`): each peer is teacher-forced along the oracle's greedy tokens
(fed the oracle's token at every step, its own argmax recorded), every step is judged by
the agreement rule, and a peer with a real flip is refused: its row gets no time.

``HF eager``         transformers ``generate``, greedy, dynamic cache: the default.
``HF static``        ``generate(..., cache_implementation="static")``: transformers compiles
                     the decode forward itself (``torch.compile(mode="reduce-overhead")``,
                     so CUDA graphs) on a GPU; on the CPU it only uses the static cache.
``oracle eager``     :class:`onelaunch.oracle.Oracle`, one decode step (T=1), op by op.
``oracle compiled``  the same step under ``torch.compile(mode="reduce-overhead")``: the
                     gpt-fast recipe. The KV cache and the weights are module buffers
                     (static addresses, so mutating the cache is allowed inside a CUDA
                     graph) and the position is a device tensor, so one graph serves
                     every step.
``llama.cpp``        :class:`llama_cpp.LlamaBench`: ``llama-bench -ngl 99 -p 0 -n 128 -d
                     ctx -fa 1`` on a bf16 GGUF of the run's weights (GPU only; where
                     ``ci/llama_build.sh`` has not built it, one line says so, no row).
``gpt-fast compiled`` (:func:`gpt_fast.fast_decode_rows`; ``bench`` runs it beside :data:`rungs.PEERS`)
                     :class:`gpt_fast.FastDecode`, the step as gpt-fast writes it (fused QKV and
                     gate/up, weights and static cache as module state, SDPA), compiled
                     with ``mode="max-autotune"`` and ``"reduce-overhead"``; the faster
                     mode that passes the check is shown. The strongest compiled peer.

``generate`` is timed whole and decode isolated as
``(T(1 + n new) - T(1 new)) / n``: the prefill and the per-call set-up cancel. The oracle
steps are timed per step with :func:`onelaunch.measure.timing.time_ms` at position ``ctx``.
Compiling the HF forward ourselves is not a rung: on transformers 5.17 wrapping
``model.forward`` in ``torch.compile(mode="reduce-overhead")`` fails on the static cache
("skipping cudagraphs due to mutated inputs", then an overwrite error);
``cache_implementation="static"`` is the supported path.

On the CPU (tiny models, fp32 unless the caller passes its weights: ``bench`` passes the
run's bf16 ones) every rung runs, for smoke tests only: there is no floor
(``floor_ms`` is None), HF static is not compiled (transformers compiles on GPUs only), and
the compiled oracle uses ``backend="aot_eager"`` by default (dynamo capture and
functionalisation of the cache writes, no code generation, no CUDA graphs). Every such
row carries a ``note`` saying so.
"""
