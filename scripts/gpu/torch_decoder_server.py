#!/usr/bin/env python3
"""A real CUDA workload gpuckpt did not write, for scripts/gpu-check.sh: a PyTorch decoder.

It builds a decoder-only transformer from a config with random weights (fixed seed, bf16,
about --gib GiB: transformers' LlamaForCausalLM when transformers is installed, else a plain
torch module of the same shape), and holds one conversation: each request appends the user's
tokens to the KV cache and generates greedily from it. Nothing is downloaded: no tokenizer
(text becomes token ids by its UTF-8 bytes), no weights.

Line protocol on a unix socket (one request per connection; --client sends one):
  PING            -> PONG
  INFO            -> pid=... backend=... params=... weight_bytes=... device=...
  SAY <n> <text>  -> OK <length> <t1,t2,...>   (the n tokens generated after <text>)
  STATE           -> OK <length> <checksum>    (token history and the whole KV cache, exact)

Two servers started with the same seed and sent the same requests answer the same on one GPU
(deterministic kernels are requested): a twin that is never checkpointed is the reference for
one that is dumped and restored mid-conversation.

  torch_decoder_server.py --socket PATH [--gib 1.5] [--seed 7]
  torch_decoder_server.py --client PATH 'SAY 16 hello' [--timeout 60]
Exits 7 without a GPU (or without torch), 2 on bad arguments.
"""

import argparse
import hashlib
import os
import socket
import sys


def client(path, request, timeout):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(path)
        s.sendall(request.encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError as e:
        print(f"error: {path}: {e}", file=sys.stderr)
        return 1
    finally:
        s.close()
    sys.stdout.write(data.decode(errors="replace"))
    return 0 if data else 1


def build_model(torch, gib, seed):
    """A decoder of about `gib` GiB of bf16 weights, random from `seed`, on cuda:0."""
    hidden, inter, vocab, heads = 2048, 5632, 32000, 16
    per_layer = 4 * hidden * hidden + 3 * hidden * inter
    fixed = 2 * vocab * hidden
    layers = max(1, round((gib * (1 << 30) / 2 - fixed) / per_layer))
    torch.manual_seed(seed)
    torch.set_default_dtype(torch.bfloat16)
    try:
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                          num_hidden_layers=layers, num_attention_heads=heads,
                          num_key_value_heads=heads, max_position_embeddings=8192)
        try:
            cfg._attn_implementation = "sdpa"
        except Exception:
            pass
        with torch.device("cuda"):
            model = LlamaForCausalLM(cfg)
        backend = "transformers"
    except ImportError:
        with torch.device("cuda"):
            model = PlainDecoder(torch, vocab, hidden, inter, heads, layers)
        backend = "torch"
    model.eval()
    return model, backend, layers


def PlainDecoder(torch, vocab, hidden, inter, heads, layers):  # noqa: N802 (a class factory)
    """The same shape without transformers: RMSNorm, attention with a KV cache, SwiGLU MLP."""
    nn, F = torch.nn, torch.nn.functional
    hd = hidden // heads

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(hidden))

        def forward(self, x):
            v = x.float().pow(2).mean(-1, keepdim=True)
            return (x.float() * torch.rsqrt(v + 1e-6)).to(x.dtype) * self.w

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = RMSNorm(), RMSNorm()
            self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
            self.o = nn.Linear(hidden, hidden, bias=False)
            self.gate_up = nn.Linear(hidden, 2 * inter, bias=False)
            self.down = nn.Linear(inter, hidden, bias=False)

        def forward(self, x, cache):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.n1(x)).view(b, t, 3, heads, hd).unbind(2)
            q, k, v = (z.transpose(1, 2) for z in (q, k, v))
            past = 0
            if cache is not None:
                past = cache[0].shape[2]
                k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
            # Causal over the new tokens, everything before them visible.
            i = torch.arange(t, device=x.device)[:, None] + past
            j = torch.arange(past + t, device=x.device)[None, :]
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=j <= i)
            x = x + self.o(a.transpose(1, 2).reshape(b, t, hidden))
            g, u = self.gate_up(self.n2(x)).chunk(2, -1)
            return x + self.down(F.silu(g) * u), (k, v)

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, hidden)
            self.pos = nn.Embedding(8192, hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm = RMSNorm()
            self.head = nn.Linear(hidden, vocab, bias=False)
            for p in self.parameters():
                if p.dim() > 1:
                    nn.init.normal_(p, std=0.02)

        def forward(self, ids, past_key_values=None, use_cache=True):
            past = past_key_values[0][0].shape[2] if past_key_values else 0
            pos = torch.arange(past, past + ids.shape[1], device=ids.device)
            x = self.embed(ids) + self.pos(pos)[None]
            new = []
            for n, blk in enumerate(self.blocks):
                x, kv = blk(x, past_key_values[n] if past_key_values else None)
                new.append(kv)

            class Out:
                pass

            out = Out()
            out.logits = self.head(self.norm(x))
            out.past_key_values = new
            return out

    return Decoder()


def cache_tensors(cache):
    """The KV cache's tensors, whatever the transformers version keeps them in."""
    if cache is None:
        return []
    if hasattr(cache, "layers"):  # transformers >= 4.56
        return [t for layer in cache.layers for t in (layer.keys, layer.values) if t is not None]
    if hasattr(cache, "key_cache"):
        return list(cache.key_cache) + list(cache.value_cache)
    return [t for kv in cache for t in kv]


class Conversation:
    def __init__(self, torch, model):
        self.torch, self.model = torch, model
        self.tokens = []
        self.cache = None
        self.vocab = model.config.vocab_size if hasattr(model, "config") else 32000

    def _forward(self, ids):
        torch = self.torch
        t = torch.tensor([ids], device="cuda")
        kw = {"use_cache": True}
        if self.cache is not None:
            kw["past_key_values"] = self.cache
        out = self.model(t, **kw)
        self.cache = out.past_key_values
        return int(out.logits[0, -1].float().argmax())

    def say(self, n, text):
        torch = self.torch
        prompt = [3 + b for b in text.encode()] or [1]  # ids of the UTF-8 bytes
        with torch.inference_mode():
            nxt = self._forward(prompt)
            self.tokens += prompt
            generated = []
            for _ in range(n):
                generated.append(nxt)
                self.tokens.append(nxt)
                nxt = self._forward([nxt])
        return generated

    def checksum(self):
        torch = self.torch
        h = hashlib.sha256(",".join(map(str, self.tokens)).encode())
        with torch.inference_mode():
            # Exact: integer sums of the bf16 bit patterns, order-independent.
            total = 0
            for i, t in enumerate(cache_tensors(self.cache)):
                bits = t.contiguous().view(torch.int16).to(torch.int64)
                total += int(bits.sum()) * (i + 1) + int((bits * bits).sum())
        h.update(str(total).encode())
        return h.hexdigest()[:16]


def serve(args):
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA initialises
    try:
        import torch
    except ImportError as e:
        print(f"no torch: {e}", file=sys.stderr)
        return 7
    if not torch.cuda.is_available():
        print("no NVIDIA GPU: torch.cuda.is_available() is false", file=sys.stderr)
        return 7
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    model, backend, layers = build_model(torch, args.gib, args.seed)
    params = sum(p.numel() for p in model.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    conv = Conversation(torch, model)
    torch.cuda.synchronize()

    if os.path.exists(args.socket):
        os.unlink(args.socket)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(args.socket)
    srv.listen(8)
    print(f"READY {args.socket} backend={backend} layers={layers} params={params}", flush=True)
    while True:
        conn, _ = srv.accept()
        with conn:
            data = b""
            while not data.endswith(b"\n"):
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            req = data.decode(errors="replace").strip()
            try:
                if req == "PING":
                    reply = "PONG"
                elif req == "INFO":
                    reply = (f"pid={os.getpid()} backend={backend} layers={layers} "
                             f"params={params} weight_bytes={weight_bytes} "
                             f"device={torch.cuda.get_device_name(0).replace(' ', '_')} "
                             f"reserved_bytes={torch.cuda.memory_reserved(0)}")
                elif req.startswith("SAY "):
                    _, n, *text = req.split(" ", 2)
                    toks = conv.say(int(n), text[0] if text else "")
                    reply = f"OK {len(conv.tokens)} {','.join(map(str, toks))}"
                elif req == "STATE":
                    reply = f"OK {len(conv.tokens)} {conv.checksum()}"
                else:
                    reply = "ERR unknown request"
            except Exception as e:  # a bad request must not end the conversation
                reply = f"ERR {type(e).__name__}: {e}"
            try:
                conn.sendall(reply.encode() + b"\n")
            except OSError:
                pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--socket")
    ap.add_argument("--gib", type=float, default=1.5)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--client", metavar="PATH")
    ap.add_argument("request", nargs="?")
    ap.add_argument("--timeout", type=float, default=60)
    args = ap.parse_args()
    if args.client:
        if not args.request:
            ap.error("--client needs a request")
        return client(args.client, args.request, args.timeout)
    if not args.socket:
        ap.error("--socket or --client is needed")
    if not 0.05 <= args.gib <= 64:
        ap.error("--gib must be between 0.05 and 64")
    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
