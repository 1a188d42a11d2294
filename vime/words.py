"""English for messages built from numbers and names: the article before a word and the plural
after a count: "write an integer here", "an A100-40GB", "1 engine of 1 GPU", never "a integer",
"a A100-40GB" or "1 engine(s) of 1 GPUs"."""

from __future__ import annotations

# Words that start with a vowel letter but a consonant sound, and the reverse; letters of
# card names and acronyms are read by their names ("an H100", "an NVMe", "a USB").
_CONSONANT_SOUND = ("one", "uni", "use", "usu", "eu")
_VOWEL_SOUND = ("hour", "honest", "heir")
_VOWEL_LETTER_NAMES = set("AEFHILMNORSX")  # "an A100", "an H100", "an MoE", "an RTX"


def article(word: str) -> str:
    """"a" or "an" for word, by how it is read aloud."""
    text = word.lstrip("[('\"`")
    if not text:
        return "a"
    lower = text.lower()
    if lower.startswith(_VOWEL_SOUND):
        return "an"
    if lower.startswith(_CONSONANT_SOUND):
        return "a"
    # an initialism or a card name (A100-40GB, H100, MoE): read letter by letter
    first_token = text.split("-")[0].split(".")[0]
    if text[0].isupper() and (first_token.isupper() or any(c.isdigit() for c in first_token)
                              or (len(first_token) > 1 and first_token[1].isupper())):
        return "an" if text[0] in _VOWEL_LETTER_NAMES else "a"
    if text[0].isdigit():
        return "an" if text.startswith(("8", "11", "18")) else "a"
    return "an" if lower[0] in "aeiou" else "a"


def a(word: str) -> str:
    """word with its article: a("integer") == "an integer", a("A100-40GB") == "an A100-40GB"."""
    return f"{article(word)} {word}"


def plural(count: float, word: str, many: str | None = None) -> str:
    """count and word, the plural when count is not 1: plural(1, "GPU") == "1 GPU"."""
    form = word if count == 1 else (many or _plural_form(word))
    return f"{count:g} {form}" if isinstance(count, float) else f"{count} {form}"


def _plural_form(word: str) -> str:
    if word.endswith(("s", "x", "ch", "sh")):
        return word + "es"
    if word.endswith("y") and word[-2:-1] not in tuple("aeiou"):
        return word[:-1] + "ies"
    return word + "s"


def count_unit(number: float) -> str:
    """A parameter count with a unit that keeps digits: 3.05e10 -> "30.5 B", 2.0e6 -> "2.0 M"."""
    for size, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(number) >= size:
            value = number / size
            return f"{value:.2f} {unit}" if value < 10 else f"{value:.1f} {unit}"
    return f"{number:.0f}"
