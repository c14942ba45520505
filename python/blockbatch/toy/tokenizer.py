"""Character-level ``tokenizers`` tokenizer for the toy task, with pad / EOS / mask specials."""

from __future__ import annotations

PAD_TOKEN = "<|pad|>"
UNK_TOKEN = "<|unk|>"
EOS_TOKEN = "<|endoftext|>"
MASK_TOKEN = "<|mdm_mask|>"
CHARS = "0123456789+-=;_.?"
# Fixed order, so ids never depend on anything but this list.
VOCAB: tuple[str, ...] = (PAD_TOKEN, UNK_TOKEN) + tuple(CHARS) + (EOS_TOKEN, MASK_TOKEN)
SPECIAL_TOKENS = (PAD_TOKEN, UNK_TOKEN, EOS_TOKEN, MASK_TOKEN)

PAD_ID = VOCAB.index(PAD_TOKEN)
EOS_ID = VOCAB.index(EOS_TOKEN)
MASK_ID = VOCAB.index(MASK_TOKEN)
VOCAB_SIZE = len(VOCAB)


def build_tokenizer():
    """A ``tokenizers.Tokenizer``: one token per character, specials never split or decoded."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token=UNK_TOKEN))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def decode_response(tokenizer, ids, eos_id: int = EOS_ID, mask_id: int = MASK_ID) -> str:
    """Text of generated ids, cut at the first EOS; a leftover mask token is kept visible."""
    ids = [int(i) for i in ids]
    if eos_id in ids:
        ids = ids[: ids.index(eos_id)]
    # A mask left in the output is an error the checker must see, not silently drop.
    return "".join(MASK_TOKEN if i == mask_id else tokenizer.decode([i], skip_special_tokens=True) for i in ids)
