"""A worker's FastAPI app (:func:`make_app`): ``GET /health``, ``GET /v1/models``, ``POST /v1/completions``,
``POST /v1/chat/completions`` (over the model's chat template) and, on an adapter host, vLLM's runtime LoRA
endpoints. Errors are in OpenAI's shape (``{"error": {"message", "type", "param", "code"}}``); bodies are read by
:func:`~swarm_runtime.serve.validate.validated` (NaN or Infinity anywhere is a 400 naming the field), a body whose
``Content-Type`` is not JSON is a 415 (:class:`~swarm_runtime.serve.guard.JsonBodies`, the gateway's check). Streams
are server-sent events, built from a finished completion (:func:`completion_chunks`, :func:`chat_chunks`)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from swarm_runtime.models.chat import template_ids
from swarm_runtime.serve.batcher import Batcher
from swarm_runtime.serve.completer import Completer, FaultInjected
from swarm_runtime.serve.guard import JsonBodies
from swarm_runtime.serve.protocol import chat_model, completion_models, lora_models
from swarm_runtime.serve.validate import BadRequest, openai_error, validated


def completion_chunks(body: dict) -> list[dict]:
    """A completion as stream chunks: each choice's pieces, its end (finish and stop reason), then the usage."""
    head = {k: body[k] for k in ("id", "object", "created", "model")}
    chunks = []
    for c in body["choices"]:
        for piece in c.pop("_pieces"):
            chunks.append(
                {
                    **head,
                    "choices": [
                        {
                            "index": c["index"],
                            "text": piece,
                            "logprobs": None,
                            "finish_reason": None,
                            "stop_reason": None,
                        }
                    ],
                }
            )
        end = {"finish_reason": c["finish_reason"], "stop_reason": c["stop_reason"]}
        chunks.append({**head, "choices": [{"index": c["index"], "text": "", "logprobs": None, **end}]})
    chunks.append({**head, "choices": [], "usage": body["usage"]})
    return chunks


def chat_head(body: dict) -> dict:
    return {"id": body["id"].replace("cmpl-", "chatcmpl-"), "created": body["created"], "model": body["model"]}


def chat_logprobs(lp: dict | None) -> dict | None:
    """A completion choice's ``logprobs`` in the chat shape: ``{"content": [{token, logprob, bytes, top_logprobs}]}``."""
    if lp is None:
        return None
    content = []
    for tok, v, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        alts = [{"token": t, "logprob": a, "bytes": list(t.encode())} for t, a in (top or {}).items() if t != tok]
        content.append({"token": tok, "logprob": v, "bytes": list(tok.encode()), "top_logprobs": alts})
    return {"content": content}


def chat_body(body: dict, prompt_ids: list[int] | None = None) -> dict:
    """A completion as a chat completion: each choice's text the assistant's message (with its log-probs and token
    ids when the completion has them; ``prompt_ids``: vLLM's top-level ``prompt_token_ids``)."""
    out = {
        **chat_head(body),
        "object": "chat.completion",
        "usage": body["usage"],
        "choices": [
            {
                "index": c["index"],
                "message": {"role": "assistant", "content": c["text"]},
                "logprobs": chat_logprobs(c.get("logprobs")),
                "finish_reason": c["finish_reason"],
                "stop_reason": c["stop_reason"],
                **({"token_ids": c["token_ids"]} if "token_ids" in c else {}),
                **({"swarm_logprobs": c["swarm_logprobs"]} if "swarm_logprobs" in c else {}),
            }
            for c in body["choices"]
        ],
    }
    return {**out, "prompt_token_ids": prompt_ids} if prompt_ids is not None else out


def chat_chunks(body: dict) -> list[dict]:
    """A completion as chat stream chunks: per choice the assistant's role, its pieces, then its finish reason."""
    head = {**chat_head(body), "object": "chat.completion.chunk"}
    chunks = []
    for c in body["choices"]:
        i = c["index"]
        chunks.append(
            {**head, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
        )
        for piece in c.pop("_pieces"):
            chunks.append({**head, "choices": [{"index": i, "delta": {"content": piece}, "finish_reason": None}]})
        chunks.append({**head, "choices": [{"index": i, "delta": {}, "finish_reason": c["finish_reason"]}]})
    return chunks


def sse(chunks: list[dict]) -> StreamingResponse:
    async def events():
        for chunk in chunks:
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def add_errors(app: FastAPI) -> None:
    """Every error in OpenAI's shape."""

    @app.exception_handler(BadRequest)
    async def bad_request(_request, exc: BadRequest):
        return JSONResponse(openai_error(exc.message, exc.status, exc.param, exc.code), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request, exc):
        return JSONResponse(openai_error(str(exc.detail), exc.status_code), status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request, exc):
        return JSONResponse(openai_error(str(exc.errors()[0].get("msg", "invalid request")), 422), status_code=422)


def add_info(app: FastAPI, completer: Completer, batcher: Batcher, model_root: str) -> None:
    """``GET /health`` (with the batching counts) and ``GET /v1/models`` (the model, and an adapter host's
    adapters first)."""
    started = int(time.time())
    model_id = completer.model_id

    @app.get("/health")
    def health():
        return {"status": "ok", "model": model_id, "pid": os.getpid(), "batching": dict(batcher.stats)}

    @app.get("/v1/models")
    def models():
        base = {
            "id": model_id,
            "object": "model",
            "created": started,
            "owned_by": "swarm-runtime",
            "root": model_root,
            "parent": None,
            "max_model_len": int(completer.context()),
        }
        host = completer.host
        loras = (
            []
            if host is None
            else [{**base, "id": name, "root": host.paths[name], "parent": model_id} for name in host.policies]
        )
        return {"object": "list", "data": [base, *loras] if host is None or not loras else [*loras, base]}


def add_lora(app: FastAPI, completer: Completer) -> None:
    """vLLM's runtime LoRA endpoints, with vLLM's request shapes (an adapter host)."""
    LoadRequest, UnloadRequest = lora_models()

    @app.post("/v1/load_lora_adapter")
    async def load_lora(request: Request):
        req = validated(LoadRequest, await request.body())
        with completer.lock:  # not while a batch runs on the base
            completer.host.load(req.lora_name, req.lora_path)
        return PlainTextResponse(f"Success: LoRA adapter '{req.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora(request: Request):
        req = validated(UnloadRequest, await request.body())
        with completer.lock:
            completer.host.unload(req.lora_name)
        return PlainTextResponse(f"Success: LoRA adapter '{req.lora_name}' removed successfully.")


def chat_prompt(policy, model_id: str, messages) -> list[int]:
    """The chat's prompt as token ids (so a policy that templates its text prompts, ``model.chat_template=auto``,
    does not again); a 400 when the model has no chat template or it refuses the messages."""
    if not getattr(policy.tok, "chat_template", None):
        raise BadRequest(
            f"model {model_id!r} has no chat template (its tokenizer_config.json has no "
            "chat_template): use /v1/completions with a prompt",
            param="messages",
        )
    try:
        return template_ids(policy.tok, [m.model_dump() for m in messages])  # as the run's templated prompts
    except Exception as exc:  # a template that refuses these messages (roles out of order, ...)
        raise BadRequest(f"messages: the chat template refused them: {exc}", param="messages") from None


def add_completions(app: FastAPI, policy, completer: Completer, batcher: Batcher) -> None:
    """``POST /v1/completions`` and ``POST /v1/chat/completions``: the model runs inline, batched across waiting
    requests."""
    CompletionRequest, ChatRequest = completion_models(), chat_model()

    async def complete(req) -> tuple[dict, float]:
        try:
            return await batcher.submit(completer.plan(req))
        except FaultInjected as exc:
            raise HTTPException(500, str(exc)) from exc
        except BadRequest:
            raise
        except ValueError as exc:  # a guided_choice text the tokenizer cannot spell
            raise BadRequest(str(exc)) from exc

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = validated(CompletionRequest, await request.body())
        body, ms = await complete(req)
        if not req.stream:
            return JSONResponse(body, headers={"x-swarm-compute-ms": f"{ms:.3f}"})
        return sse(completion_chunks(body))

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        """OpenAI's chat completions over the model's chat template (a 400 when it has none)."""
        req = validated(ChatRequest, await request.body())
        prompt = chat_prompt(policy, completer.model_id, req.messages)
        names = ("model", "temperature", "top_p", "n", "seed", "stop", "stream", "return_token_ids", "swarm_logprobs")
        fields = {k: getattr(req, k) for k in names}
        if req.logprobs:
            fields["logprobs"] = int(req.top_logprobs or 0)
        max_tokens = req.max_completion_tokens or req.max_tokens or 16
        body, ms = await complete(
            validated(CompletionRequest, json.dumps({**fields, "prompt": prompt, "max_tokens": max_tokens}).encode())
        )
        if not req.stream:
            ids = body["choices"][0].get("prompt_token_ids") if req.return_token_ids else None
            return JSONResponse(chat_body(body, ids), headers={"x-swarm-compute-ms": f"{ms:.3f}"})
        return sse(chat_chunks(body))


def make_app(policy, opts) -> FastAPI:
    """The worker's FastAPI app for ``policy`` (``opts``: its :class:`~swarm_runtime.serve.worker.WorkerOptions`)."""
    model_id = opts.name or Path(opts.model).name
    completer = Completer(policy, model_id, opts)
    batcher = Batcher(completer)
    app = FastAPI(title=f"swarm agent {model_id}")
    add_errors(app)
    add_info(app, completer, batcher, str(opts.model))
    if completer.host is not None:
        add_lora(app, completer)
    add_completions(app, policy, completer, batcher)
    app.add_middleware(JsonBodies)
    return app
