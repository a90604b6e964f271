"""Render chat conversations to prompt text with the model's own chat template, in an arm (stdin/stdout JSON).

Request: {"model": DIR, "conversations": [[{"role", "content"}, ...], ...]}. Result: {"texts": [...], "template":
"model" | "plain"}: "plain" when the tokenizer has no chat template (then "ROLE: content" lines and "assistant:").
"""

import json
import sys


def main() -> None:
    req = json.loads(sys.stdin.read())
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(req["model"])
    texts: list[str] = []
    kind = "model"
    for conv in req["conversations"]:
        if getattr(tok, "chat_template", None):
            texts.append(tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True))
        else:
            kind = "plain"
            texts.append("".join(f"{m['role']}: {m['content']}\n" for m in conv) + "assistant:")
    print(json.dumps({"texts": texts, "template": kind}))


if __name__ == "__main__":
    main()
