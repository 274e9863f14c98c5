"""A reference completions server for the CPU tests of the engine samplers: the subset of vLLM's OpenAI
server the samplers use (``/health``, ``/v1/models``, ``/v1/completions`` with token-id prompts and vLLM's
extra fields, ``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``), computed for real with
transformers + PEFT from the same folders a vLLM server would load. A separate process, so a test can
kill it (``kill -9``) mid-call.

    python tests/engine/refserver.py --model BASE --port P [--no-lora]
"""

from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--no-lora", action="store_true", help="no runtime LoRA endpoints (404), as vLLM without them")
    ap.add_argument("--max-lora-rank", type=int, default=64)
    a, _ = ap.parse_known_args()
    torch.set_num_threads(1)
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    state = {"model": base, "loras": {}}  # name -> path
    lock = threading.Lock()

    def forward(name: str, ids: list[int]) -> torch.Tensor:
        m = state["model"]
        x = torch.tensor([ids])
        with torch.no_grad():
            if name == a.model:
                if isinstance(m, PeftModel):
                    with m.disable_adapter():
                        return m(input_ids=x).logits[0, -1].float()
                return m(input_ids=x).logits[0, -1].float()
            m.set_adapter(name)
            return m(input_ids=x).logits[0, -1].float()

    def complete(req: dict) -> dict:
        name = req.get("model") or a.model
        if name != a.model and name not in state["loras"]:
            return {"_status": 404, "error": {"message": f"The model `{name}` does not exist.", "code": 404}}
        ids = list(req["prompt"])
        gen = torch.Generator().manual_seed(int(req.get("seed") or 0))
        t = float(req.get("temperature", 1.0) if req.get("temperature") is not None else 1.0)
        bias = {int(k): float(v) for k, v in (req.get("logit_bias") or {}).items()}
        allowed = req.get("allowed_token_ids")
        stops = set(req.get("stop_token_ids") or [])
        k = int(req.get("logprobs") or 0)
        wanted = req.get("logprob_token_ids")
        out, lps, tops, finish = [], [], [], "length"
        for _ in range(int(req.get("max_tokens", 16))):
            logits = forward(name, ids + out)
            raw = torch.log_softmax(logits, -1)
            proc = logits.clone()
            if allowed:
                mask = torch.full_like(proc, float("-inf"))
                mask[allowed] = 0.0
                proc = proc + mask
            for tok, v in bias.items():
                proc[tok] += v
            nxt = (
                int(proc.argmax())
                if t <= 1e-5
                else int(torch.multinomial(torch.softmax(proc / t, -1), 1, generator=gen))
            )
            out.append(nxt)
            lps.append(float(raw[nxt]))
            ids_top = list(wanted) if wanted else raw.topk(k).indices.tolist() if k else []
            tops.append({f"token_id:{i}": float(raw[i]) for i in [nxt, *ids_top]})
            if nxt in stops or nxt == state["model"].config.eos_token_id:
                finish = "stop"
                break
        return {
            "object": "text_completion",
            "model": name,
            "choices": [
                {
                    "index": 0,
                    "text": "",
                    "finish_reason": finish,
                    "token_ids": out if req.get("return_token_ids") else None,
                    "logprobs": {"tokens": [f"token_id:{i}" for i in out], "token_logprobs": lps, "top_logprobs": tops},
                }
            ],
        }

    def load(req: dict) -> dict:
        name, path = req.get("lora_name"), req.get("lora_path")
        if name in state["loras"] and not req.get("load_inplace"):
            return {"_status": 400, "error": {"message": f"The lora adapter '{name}' has already been loaded."}}
        r = json.loads(open(f"{path}/adapter_config.json").read())["r"]
        if r > a.max_lora_rank:
            return {
                "_status": 400,
                "error": {"message": f"LoRA rank {r} is greater than max_lora_rank {a.max_lora_rank}."},
            }
        m = state["model"]
        if name in state["loras"]:
            m.delete_adapter(name)
        if isinstance(m, PeftModel):
            m.load_adapter(path, adapter_name=name)
        else:
            state["model"] = PeftModel.from_pretrained(m, path, adapter_name=name).eval()
        state["loras"][name] = path
        return {"_text": f"Success: LoRA adapter '{name}' added successfully."}

    def unload(req: dict) -> dict:
        name = req.get("lora_name")
        if name not in state["loras"]:
            return {"_status": 404, "error": {"message": f"The lora adapter '{name}' cannot be found."}}
        state["model"].delete_adapter(name)
        del state["loras"][name]
        return {"_text": f"Success: LoRA adapter '{name}' removed successfully."}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _send(self, status: int, body) -> None:
            raw = (body if isinstance(body, str) else json.dumps(body)).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self):
            if self.path == "/health":
                return self._send(200, "")
            if self.path == "/v1/models":
                data = [{"id": a.model, "root": a.model, "parent": None}]
                data += [{"id": n, "root": p, "parent": a.model} for n, p in state["loras"].items()]
                return self._send(200, {"object": "list", "data": data})
            self._send(404, {"detail": "Not Found"})

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            routes = {"/v1/completions": complete}
            if not a.no_lora:
                routes.update({"/v1/load_lora_adapter": load, "/v1/unload_lora_adapter": unload})
            fn = routes.get(self.path)
            if fn is None:
                return self._send(404, {"detail": "Not Found"})
            with lock:
                res = fn(req)
            status = res.pop("_status", 200)
            self._send(status, res.pop("_text") if "_text" in res else res)

    class Server(ThreadingHTTPServer):
        request_queue_size = 256  # every row of a batch connects at once (rollout.concurrency)
        daemon_threads = True

    Server((a.host, a.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
