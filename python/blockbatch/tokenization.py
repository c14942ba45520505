"""Text <-> ids with the checkpoint's own tokenizer (``tokenizers``) and chat template."""

from __future__ import annotations

from typing import Sequence

from .config import ModelConfig

# End-of-turn markers of common chat formats; any present in the vocabulary also ends a reply.
END_OF_TURN_TOKENS = ("<|eot_id|>", "<|im_end|>", "<|end_of_turn|>")


class TextCodec:
    """Encodes prompts (optionally through the chat template) and decodes generations."""

    def __init__(self, tokenizer, config: ModelConfig, chat_template: str | None = None):
        self.tokenizer = tokenizer
        self.config = config
        self.chat_template = chat_template
        self.stop_ids = {config.eos_token_id}
        for token in END_OF_TURN_TOKENS:
            token_id = tokenizer.token_to_id(token)
            if token_id is not None:
                self.stop_ids.add(token_id)

    def encode(self, text: str, chat: bool | None = None, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; wrapped in the chat template when ``chat`` (default: if one exists).

        ``add_special_tokens=False`` encodes text that is already rendered (e.g. by lm-eval's
        --apply_chat_template) without the tokenizer's BOS / post-processor tokens."""
        use_chat = self.chat_template is not None if chat is None else chat
        if use_chat:
            rendered = self.render_chat([{"role": "user", "content": text}], add_generation_prompt=True)
            return self.tokenizer.encode(rendered, add_special_tokens=False).ids
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def render_chat(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
        """The chat template applied to ``messages`` (``[{"role": ..., "content": ...}, ...]``), as text."""
        if self.chat_template is None:
            raise ValueError("chat=True but the checkpoint has no chat template (tokenizer_config.json)")
        import jinja2

        env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
        return env.from_string(self.chat_template).render(
            messages=list(messages), add_generation_prompt=add_generation_prompt,
            bos_token=self._token_text("bos"), eos_token=self._token_text("eos"))

    def _token_text(self, kind: str) -> str:
        if kind == "eos":
            return self.tokenizer.id_to_token(self.config.eos_token_id) or ""
        for candidate in ("<|startoftext|>", "<s>", "<|begin_of_text|>", "<bos>"):
            if self.tokenizer.token_to_id(candidate) is not None:
                return candidate
        return ""

    def trim(self, ids: Sequence[int]) -> list[int]:
        """Generated ids up to (not including) the first EOS / end-of-turn token."""
        out = []
        for i in ids:
            if i in self.stop_ids:
                break
            out.append(int(i))
        return out

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)
