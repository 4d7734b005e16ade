"""AR greedy decoding over a static cache; on CUDA each one-token step replays a captured CUDA graph
(gpt-fast's habit: the small decode step is launch-bound without one)."""

from __future__ import annotations

import torch

from .decode import Result, clock, emit
from .model import Model


class StaticDecoder:
    def __init__(self, model: Model, max_len: int, graph: bool | None = None, compile: bool = False):
        self.model = model
        self.step = torch.compile(self._step, fullgraph=True, dynamic=False) if compile else self._step
        dev = model.lm_head_weight.device
        self.cache = model.new_cache(max_len, static=True)
        self.tok = torch.zeros(1, 1, dtype=torch.long, device=dev)
        self.pos = torch.zeros(1, 1, dtype=torch.long, device=dev)
        self.graph = None
        if graph if graph is not None else dev.type == "cuda":
            side = torch.cuda.Stream(dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side), torch.no_grad():
                for _ in range(3):
                    self.step()
            torch.cuda.current_stream(dev).wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph), torch.no_grad():
                self.next = self.step()

    def _step(self) -> torch.Tensor:
        return self.model(self.tok, self.cache, positions=self.pos).logits[0, -1].argmax()

    @torch.no_grad()
    def generate(self, prompt: list[int], max_new_tokens: int, eos: set[int] | None = None) -> Result:
        if len(prompt) + max_new_tokens > self.cache.max_len:
            raise ValueError(f"prompt + max_new_tokens exceeds the static cache ({self.cache.max_len})")
        eos = set(self.model.cfg.eos_token_id) if eos is None else eos
        dev = self.tok.device
        for t in (*self.cache.h.values(), *self.cache.conv.values()):
            t.zero_()
        res = Result([])
        t0 = clock(dev)
        pos = torch.arange(len(prompt), device=dev)[None]
        newest = int(self.model(torch.tensor([prompt], device=dev), self.cache, positions=pos).logits[0, -1].argmax())
        t1 = clock(dev)
        res.prefill_s = t1 - t0
        done, p = emit(res.tokens, [newest], eos, max_new_tokens), len(prompt)
        while not done:
            self.tok.fill_(newest)
            self.pos.fill_(p)
            if self.graph is not None:
                self.graph.replay()
                newest = int(self.next)
            else:
                newest = int(self.step())
            p += 1
            done = emit(res.tokens, [newest], eos, max_new_tokens)
        res.decode_s = clock(dev) - t1
        return res
