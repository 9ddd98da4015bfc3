#!/usr/bin/env python3
"""Trains small tokenizers with the Hugging Face `tokenizers` library and writes
test fixtures for the C++ tokenizer (common/tokenizer/tokenizer.h).

Each fixture lands in tests/fixtures/tokenizers/<name>/ as
  tokenizer.json          the HF tokenizer (trained here, deterministic corpus)
  tokenizer_config.json   transformers-style config (bos/eos, chat_template, ...)
  expected.json           HF encodings and decodings of a test corpus

Fixtures:
  bytelevel_llama3  byte-level BPE, Llama-3 Split regex + ByteLevel(use_regex=False),
                    ignore_merges, merges in list form, <|begin_of_text|> template.
  bytelevel_gpt2    byte-level BPE, ByteLevel(add_prefix_space, GPT-2 regex) then
                    Digits(individual_digits), merges in "a b" string form,
                    added tokens with lstrip / rstrip / single_word / normalized flags.
  metaspace_llama2  Llama-2 style: normalizer Prepend+Replace, BPE with byte_fallback
                    (<0x00>..<0xFF>), <unk>/<s>/</s>, TemplateProcessing "<s> $A",
                    decoder Replace/ByteFallback/Fuse/Strip, merges in string form.
  metaspace_pretok  the same vocabulary with pre_tokenizer Metaspace(prepend_scheme=first,
                    split=true), decoder Metaspace, byte_fallback off and fuse_unk on.

Usage:
  python3 tools/make_tokenizer_fixtures.py [--out tests/fixtures/tokenizers]
      trains the fixtures above and writes them under --out.
  python3 tools/make_tokenizer_fixtures.py --expected-for MODEL_DIR [--expected-out PATH]
      writes expected.json (default MODEL_DIR/expected.json) for an existing
      model dir's tokenizer.json over the same test corpus, e.g. for the
      TESSERA_SMOLLM2_DIR test in tests/unit/common/tokenizer/tokenizer_test.cc.
Requires: pip install tokenizers

BPE training breaks ties between equally frequent pairs in hash order, so a
re-run may learn a slightly different (equally valid) vocabulary; each
expected.json always matches the tokenizer.json written beside it.
"""
import argparse
import json
import os

import tokenizers
from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Training text. Mixed scripts so that merges exist for accents and CJK, while
# some characters of the test corpus stay rare (byte fallback / unk paths).
BASE_TEXT = """\
The quick brown fox jumps over the lazy dog. The dog sleeps in the sun.
Tokenizers split text into pieces; models read the pieces as numbers.
It's a small world, isn't it? They'll say we've done it, and I'm sure they'd agree.
In 1969 the first humans walked on the Moon; in 2024 we counted 12345 stars.
Prices: $3.99, $12.50 and 100% of 250 is 250. Call 555-0123 at 10:30.
def tokenize(text):
    return [piece for piece in text.split() if piece]
for (int i = 0; i < n; ++i) { sum += values[i] * 2; }
Le café est très bon. Où est la bibliothèque ? Ça va très bien, merci.
Die Straße ist schön, und die Bäume sind grün. Über den Wolken fliegen Vögel.
El niño come una manzana. ¿Dónde está la estación? ¡Qué día tan bonito!
Привет, как дела? Я люблю читать книги. Москва — большой город.
Γειά σου κόσμε. Η γλώσσα είναι όμορφη.
東京は日本の首都です。今日はいい天気ですね。私は本を読みます。
我们在学习自然语言处理。今天天气很好。中文字符和日本語の文字。
한국어 문장도 조금 있습니다. 안녕하세요.
Numbers like 3.14159, 2.71828 and 1,000,000 appear in text. Year 2025.
Emails: someone@example.com; paths: /usr/local/bin; URLs: https://example.org/a?b=c
"""

WORDS = ("time person year way day thing man world life hand part child eye woman place "
         "work week case point government company number group problem fact good new "
         "first last long great little own other old right big high different small "
         "large next early young important few public bad same able token model layer "
         "tensor rank stage batch cache kernel vector matrix weight bias norm attention "
         "être naïve résumé café façade Zürich Ångström jalapeño coöperate").split()


def lcg(seed):
    """Deterministic pseudo-random stream (independent of Python's random)."""
    state = seed
    while True:
        state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        yield state >> 33


def training_corpus():
    lines = [line for line in BASE_TEXT.splitlines()]
    rng = lcg(20240601)
    for _ in range(400):
        n = 4 + next(rng) % 10
        words = [WORDS[next(rng) % len(WORDS)] for _ in range(n)]
        if next(rng) % 3 == 0:
            words[0] = words[0].capitalize()
        sep = "  " if next(rng) % 11 == 0 else " "
        tail = [".", "!", "?", ",", ":", " 42.", "\t(ok)"][next(rng) % 7]
        lines.append(sep.join(words) + tail)
    return lines * 2 + BASE_TEXT.splitlines() * 3


SPECIAL_LINES = [
    "<|begin_of_text|>Hello<|end_of_text|>",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>",
    "text before <|im_start|> and after<|im_end|>",
    "<|im_start|><|im_end|><|im_start|>",
    "partial <|im_start and <|im_end| tokens",
    "<s>Hello</s> world <s> again",
    "<unk> literal unk </s>",
    "<|endoftext|>GPT end<|endoftext|>",
    "fill the <mask> here and  <mask>  there",
    "an [NEW] token and[NEW]glued",
    "hello hellox hello, ahello",
]

TEST_CORPUS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Café, résumé, naïve, Zürich, Ångström, façade",
    "日本語のテキストと中文字符",
    "東京は日本の首都です。",
    "emoji: 😀🎉👍🏽 and 🇫🇷 flag, family 👨‍👩‍👧",
    "multiple    spaces   here",
    "tabs\tand\ttabs\t\tdouble",
    "newlines\n\nand\r\nCRLF\n",
    "  \n\t  mixed whitespace \n ",
    "digits 12345 and 3.14159 and 1,000,000 and 007",
    "",
    " ",
    " leading space",
    "   three leading spaces",
    "trailing space ",
    "\nleading newline",
    "I'm sure they'll say we've done it, DON'T YOU'D?",
    "x",
    "¿Qué tal? Привет мир! Γειά σου κόσμε",
    "def f(x):\n    return x**2  # comment\n",
    "zero\u200bwidth and long ſ s and nbsp\u00a0here",
    "control\u0001char and del\u007f and nul\u0000end",
    "supercalifragilisticexpialidocious",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "한국어 문장 안녕하세요",
    "math: x² + y³ = z½ ٣٤٥ and ①②",
    "mixedCASE WORDS 'S 'T 'Re",
] + SPECIAL_LINES


def train_bytelevel(pre_tokenizer, vocab_size, specials):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(training_corpus(), trainer)
    return tok


def make_llama3():
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"]
    tok = train_bytelevel(pre, 900, specials)
    j = json.loads(tok.to_str())
    j["model"]["ignore_merges"] = True
    tok = Tokenizer.from_str(json.dumps(j))
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A:0 <|begin_of_text|>:1 $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)]),
    ])
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|begin_of_text|>",
        "eos_token": {"content": "<|im_end|>", "lstrip": False, "rstrip": False,
                      "normalized": False, "single_word": False},
        "clean_up_tokenization_spaces": True,
        "model_max_length": 8192,
        "chat_template": ("{{ bos_token }}{% for message in messages %}<|im_start|>"
                          "{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
                          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                          "{% endif %}"),
    }
    return tok, config, False


def make_gpt2():
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True),
        pre_tokenizers.Digits(individual_digits=True),
    ])
    tok = train_bytelevel(pre, 700, ["<|endoftext|>"])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    tok.add_tokens([
        AddedToken("<mask>", lstrip=True, rstrip=False, single_word=False, normalized=False,
                   special=True),
        AddedToken("[NEW]", lstrip=False, rstrip=True, normalized=True, special=False),
        AddedToken("hello", single_word=True, normalized=False, special=False),
    ])
    config = {
        "tokenizer_class": "GPT2Tokenizer",
        "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
        "add_prefix_space": True,
        "model_max_length": 1024,
    }
    return tok, config, True


def metaspace_base():
    """A metaspace BPE vocabulary: <unk> <s> </s>, <0x00>..<0xFF>, then trained pieces."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always",
                                                 split=True)
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"],
                                  limit_alphabet=120, show_progress=False)
    tok.train_from_iterator(training_corpus(), trainer)
    j = json.loads(tok.to_str())
    trained = sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for piece, _ in trained:
        if piece not in vocab:
            vocab[piece] = len(vocab)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in j["model"]["merges"]]
    return vocab, merges


def add_llama_specials(tok):
    tok.add_special_tokens([
        AddedToken("<unk>", normalized=False, special=True),
        AddedToken("<s>", normalized=False, special=True),
        AddedToken("</s>", normalized=False, special=True),
    ])


LLAMA2_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}"
    "{{ message['content'] + eos_token }}{% endif %}{% endfor %}")


def make_llama2(vocab, merges):
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True,
                               fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                           normalizers.Replace(" ", "\u2581")])
    tok.pre_tokenizer = None
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s>:1 $B:1", special_tokens=[("<s>", 1)])
    add_llama_specials(tok)
    config = {
        "tokenizer_class": "LlamaTokenizer",
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": False,
                      "normalized": False, "rstrip": False, "single_word": False},
        "eos_token": {"__type": "AddedToken", "content": "</s>", "lstrip": False,
                      "normalized": False, "rstrip": False, "single_word": False},
        "unk_token": "<unk>",
        "legacy": True,
        "chat_template": LLAMA2_CHAT_TEMPLATE,
    }
    return tok, config, True


def make_metaspace_pretok(vocab, merges):
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=False,
                               fuse_unk=True))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first",
                                                 split=True)
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first", split=True)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> $B:1 </s>:1",
        special_tokens=[("<s>", 1), ("</s>", 2)])
    add_llama_specials(tok)
    config = {
        "tokenizer_class": "LlamaTokenizerFast",
        "add_bos_token": True,
        "add_eos_token": True,
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "legacy": False,
        "chat_template": LLAMA2_CHAT_TEMPLATE,
    }
    return tok, config, False


def to_string_merges(tok):
    """Rewrites merges from the ["a", "b"] list form into the older "a b" string form."""
    j = json.loads(tok.to_str())
    merges = j["model"]["merges"]
    assert all(" " not in a and " " not in b for a, b in merges)
    j["model"]["merges"] = [a + " " + b for a, b in merges]
    return Tokenizer.from_str(json.dumps(j, ensure_ascii=False))


def decode_cases(tok, vocab_size):
    """Id sequences that stress decoders: emoji/CJK ids cut mid-character, specials, random ids."""
    cases = []
    for text in ["😀🎉 日本語", "Zürich café", "<|im_start|>hi<|im_end|>", " \n x"]:
        ids = tok.encode(text, add_special_tokens=False).ids
        for cut in range(1, len(ids) + 1):
            cases.append(ids[:cut])
        cases.append(ids[1:])
    rng = lcg(7)
    for _ in range(40):
        n = 1 + next(rng) % 12
        cases.append([int(next(rng) % vocab_size) for _ in range(n)])
    cases.append([])
    out = []
    for ids in cases:
        out.append({"ids": ids,
                    "decode": tok.decode(ids, skip_special_tokens=False),
                    "decode_skip_special": tok.decode(ids, skip_special_tokens=True)})
    return out


def expected_for(tok):
    """HF encodings and decodings of TEST_CORPUS and of decode_cases for `tok`."""
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    cases = []
    for text in TEST_CORPUS:
        with_sp = tok.encode(text, add_special_tokens=True)
        without = tok.encode(text, add_special_tokens=False)
        cases.append({
            "text": text,
            "tokens": without.tokens,
            "ids": without.ids,
            "ids_with_special": with_sp.ids,
            "decode": tok.decode(with_sp.ids, skip_special_tokens=False),
            "decode_skip_special": tok.decode(with_sp.ids, skip_special_tokens=True),
        })
    expected = {
        "generator": "tools/make_tokenizer_fixtures.py",
        "tokenizers_version": tokenizers.__version__,
        "vocab_size": vocab_size,
        "cases": cases,
        "decode_cases": decode_cases(tok, vocab_size),
    }
    return expected


def write_expected(path, expected):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False, indent=0)
        f.write("\n")


def write_fixture(out_dir, name, tok, config, string_merges):
    if string_merges:
        tok = to_string_merges(tok)
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    tok_path = os.path.join(d, "tokenizer.json")
    tok.save(tok_path, pretty=False)
    # Reload from disk so that the expectations come from exactly the saved file.
    tok = Tokenizer.from_file(tok_path)
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
        f.write("\n")
    write_expected(os.path.join(d, "expected.json"), expected_for(tok))
    for fn in ("tokenizer.json", "tokenizer_config.json", "expected.json"):
        size = os.path.getsize(os.path.join(d, fn))
        assert size < 200 * 1024, f"{name}/{fn} is {size} bytes"
        print(f"{name}/{fn}: {size} bytes")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "tokenizers"))
    parser.add_argument("--expected-for", metavar="MODEL_DIR",
                        help="write expected.json for MODEL_DIR/tokenizer.json instead of training")
    parser.add_argument("--expected-out", metavar="PATH",
                        help="where --expected-for writes (default MODEL_DIR/expected.json)")
    args = parser.parse_args()
    if args.expected_for:
        tok = Tokenizer.from_file(os.path.join(args.expected_for, "tokenizer.json"))
        out = args.expected_out or os.path.join(args.expected_for, "expected.json")
        write_expected(out, expected_for(tok))
        print(f"wrote {out}")
        return
    write_fixture(args.out, "bytelevel_llama3", *make_llama3())
    write_fixture(args.out, "bytelevel_gpt2", *make_gpt2())
    vocab, merges = metaspace_base()
    write_fixture(args.out, "metaspace_llama2", *make_llama2(vocab, merges))
    write_fixture(args.out, "metaspace_pretok", *make_metaspace_pretok(vocab, merges))


if __name__ == "__main__":
    main()
