"""JSON numbers as GBNF: integer and decimal ranges and multiples, exact to the written digits.

Role: the numeric half of serve/generation/json_schema.py's compiler (`minimum`, `maximum`, `exclusiveMinimum`,
`exclusiveMaximum`, `multipleOf` on integers and numbers). Bounds are read as the exact decimals they are
written as (`exact`: 0.1 is 1/10, not the float nearest it), and so is `multipleOf`: a number is a multiple of
0.01 when its decimal value is, as JSON Schema defines it (a validator that divides floats may disagree:
0.07 / 0.01 is 7.000000000000001 in binary floating point). Every grammar here writes numbers without an
exponent: a valid subset of what the schema allows, never a superset.

Decimal `multipleOf` (a step s written with d fraction digits): s = 10^-d (0.1, 0.01) is any number with at
most d fraction digits, within the bounds if any; any step with both bounds around at most MULTIPLES_MAX
multiples lists them; s = 1/n otherwise (0.5, 0.25, 0.2), bounds or not, is an integer part and one of the n
fraction endings (the values of an integer part a bound cuts listed). Anything else (0.3 or 2.5 without both
bounds, or with too many multiples between them) is refused (`None`: the caller names it).

Public surface: `integer_range`, `int_bounds`, `real_bounds`, `number_range`, `exact`, `integer_multiples`,
`decimal_multiples`, `INT_DIGITS_MAX`, `FRAC_DIGITS_MAX`, `MULTIPLES_MAX`. Knows no schema keywords' paths and
no HTTP.
"""
from __future__ import annotations

import math
from fractions import Fraction

INT_DIGITS_MAX = 16  # an integer's digits (beyond, a model is looping, not answering)
FRAC_DIGITS_MAX = 16
MULTIPLES_MAX = 1024  # a multipleOf whose values are listed: at most this many


def digits_range(lo: str, hi: str) -> str:
    """GBNF for decimal strings of equal length between lo and hi (inclusive, lo <= hi)."""
    if len(lo) == 1:
        return f"[{lo}-{hi}]"
    if lo == "0" * len(lo) and hi == "9" * len(hi):  # (keeps the recursion linear in the digits)
        return f"[0-9]{{{len(lo)}}}"
    if lo[0] == hi[0]:
        return f'"{lo[0]}" ( {digits_range(lo[1:], hi[1:])} )'
    n = len(lo) - 1
    alts = [f'"{lo[0]}" ( {digits_range(lo[1:], "9" * n)} )']
    if int(hi[0]) - int(lo[0]) > 1:
        alts.append(f"[{int(lo[0]) + 1}-{int(hi[0]) - 1}] [0-9]{{{n}}}")
    alts.append(f'"{hi[0]}" ( {digits_range("0" * n, hi[1:])} )')
    return " | ".join(alts)


def natural_range(lo: int, hi: int | None) -> str:
    """GBNF for integers without sign or leading zeros in [lo, hi] (hi None: up to INT_DIGITS_MAX digits)."""
    top = 10 ** INT_DIGITS_MAX - 1
    hi = top if hi is None else min(hi, top)
    alts = []
    for n in range(len(str(lo)), len(str(hi)) + 1):
        a, b = max(lo, 10 ** (n - 1) if n > 1 else 0), min(hi, 10 ** n - 1)
        if a <= b:
            alts.append(f"( {digits_range(str(a).zfill(n), str(b).zfill(n))} )")
    return " | ".join(alts)


def integer_range(lo: int | None, hi: int | None) -> str:
    if lo is not None and hi is not None and lo > hi:
        raise ValueError("minimum above maximum")
    alts = []
    if hi is None or hi >= 0:
        alts.append(natural_range(max(lo or 0, 0), hi))
    if lo is None or lo < 0:  # negative part: "-" then |x| in [max(1, -hi), -lo]
        neg_hi = None if lo is None else -lo
        alts.append(f'"-" ( {natural_range(max(1, -hi if hi is not None and hi < 0 else 1), neg_hi)} )')
    return " | ".join(f"( {a} )" for a in alts)


def _ceil(x) -> int:
    return int(x) if float(x).is_integer() else int(x // 1) + 1


def _floor(x) -> int:
    return int(x // 1)


def int_bounds(bounds: dict) -> tuple[int | None, int | None]:
    """The integer range [lo, hi] (None: open) of minimum/maximum/exclusive* (the tightest of each side)."""
    lo = hi = None
    if "minimum" in bounds:
        lo = _ceil(bounds["minimum"])
    if "exclusiveMinimum" in bounds:
        e = _floor(bounds["exclusiveMinimum"]) + 1
        lo = e if lo is None else max(lo, e)
    if "maximum" in bounds:
        hi = _floor(bounds["maximum"])
    if "exclusiveMaximum" in bounds:
        e = _ceil(bounds["exclusiveMaximum"]) - 1
        hi = e if hi is None else min(hi, e)
    return lo, hi


def exact(v) -> Fraction:
    """A JSON number's exact decimal value (0.1 is 1/10, as written, not the float nearest it)."""
    return Fraction(v) if isinstance(v, int) else Fraction(repr(float(v)))


def real_bounds(bounds: dict) -> tuple[Fraction | None, bool, Fraction | None, bool]:
    """(lo, lo exclusive, hi, hi exclusive) of a number's bounds, the tightest of each side."""
    lo = hi = None
    lo_open = hi_open = False
    for key, is_open in (("minimum", False), ("exclusiveMinimum", True)):
        if key in bounds:
            v = exact(bounds[key])
            if lo is None or v > lo or (v == lo and is_open):
                lo, lo_open = v, is_open
    for key, is_open in (("maximum", False), ("exclusiveMaximum", True)):
        if key in bounds:
            v = exact(bounds[key])
            if hi is None or v < hi or (v == hi and is_open):
                hi, hi_open = v, is_open
    return lo, lo_open, hi, hi_open


def _inside(x: Fraction, lo, lo_open, hi, hi_open) -> bool:
    return (lo is None or x > lo or (x == lo and not lo_open)) and (hi is None or x < hi or (x == hi and not hi_open))


def _fraction_digits(lo, lo_open, hi, hi_open, frac_max: int = FRAC_DIGITS_MAX) -> str:
    """GBNF for the fraction digits D (1..frac_max of them) with 0.D inside the bounds (which lie in
    [0, 1]): for each length L, the L-digit strings from the smallest to the largest inside."""
    alts = []
    for n in range(1, frac_max + 1):
        scale = 10 ** n
        a = math.ceil(lo * scale)
        if Fraction(a, scale) == lo and lo_open:
            a += 1
        b = math.floor(hi * scale)
        if Fraction(b, scale) == hi and hi_open:
            b -= 1
        a, b = max(a, 0), min(b, scale - 1)
        if a <= b:
            alts.append(f"( {digits_range(str(a).zfill(n), str(b).zfill(n))} )")
    return " | ".join(alts)


def _magnitude_range(lo: Fraction, lo_open: bool, hi: Fraction | None, hi_open: bool,
                     frac_max: int = FRAC_DIGITS_MAX) -> str:
    """GBNF for unsigned decimals (no exponent) in the bounds, 0 <= lo: the integers inside; every integer
    part i whose whole [i, i+1) is inside, with any fraction; the fractions inside for the (at most two)
    integer parts the bounds cut."""
    frac = f'"." [0-9]{{1,{frac_max}}}'
    alts = []
    first = math.ceil(lo) + (1 if lo_open and lo == math.ceil(lo) else 0)
    last = None if hi is None else math.floor(hi) - (1 if hi_open and hi == math.floor(hi) else 0)
    if last is None or first <= last:
        alts.append(f"( {natural_range(first, last)} )")
    whole_last = None if hi is None else math.floor(hi) - 1        # [i, i+1) inside: i + 1 <= hi
    if whole_last is None or first <= whole_last:
        alts.append(f"( {natural_range(first, whole_last)} ) {frac}")
    for i in sorted({math.floor(lo)} | (set() if hi is None else {math.floor(hi)})):
        if i < 0 or (first <= i and (whole_last is None or i <= whole_last)):
            continue  # a whole interval, written above
        if hi == i:  # the upper bound, an integer: i itself, and written with zeros after the point
            if not hi_open and first <= i:
                alts.append(f'"{i}" "." "0"{{1,{frac_max}}}')
            continue
        digits = _fraction_digits(max(lo - i, Fraction(0)), lo_open and lo >= i,
                                  Fraction(1) if hi is None or hi >= i + 1 else hi - i, hi is not None and hi < i + 1
                                  and hi_open, frac_max)
        if digits:
            alts.append(f'"{i}" "." ( {digits} )')
    return " | ".join(alts)


def number_range(lo, lo_open, hi, hi_open, frac_max: int = FRAC_DIGITS_MAX) -> str:
    """GBNF for JSON numbers in the bounds (None: open) with at most `frac_max` fraction digits (no exponent: a
    valid subset): the non-negative part, then "-" and the magnitudes of the negative part (never "-0")."""
    alts = []
    if hi is None or hi > 0 or (hi == 0 and not hi_open):
        low = Fraction(0) if lo is None or lo < 0 else lo
        alts.append(_magnitude_range(low, lo_open and lo is not None and lo >= 0, hi, hi_open, frac_max))
    if lo is None or lo < 0:
        top = None if lo is None else -lo
        bottom = Fraction(0) if hi is None or hi >= 0 else -hi
        neg = _magnitude_range(bottom, True if bottom == 0 else hi_open, top, lo_open, frac_max)
        if neg:
            alts.append(f'"-" ( {neg} )')
    return " | ".join(f"( {a} )" for a in alts if a)


def _decimal_text(x: Fraction) -> str:
    """An exact decimal (its denominator divides a power of ten) written as JSON: no exponent, no trailing
    zeros after the point, "0" for zero."""
    sign, x = ("-" if x < 0 else ""), abs(x)
    whole, rest = divmod(x, 1)
    digits = 0
    while (10 ** digits) % rest.denominator:
        digits += 1
    frac = str(rest * 10 ** digits).zfill(digits).rstrip("0") if rest else ""
    return f"{sign}{whole}" + (f".{frac}" if frac else "")


def _listed(step: Fraction, lo, lo_open, hi, hi_open) -> str | None:
    """The multiples of `step` inside both bounds, listed (None: a bound is open or they are too many)."""
    if lo is None or hi is None:
        return None
    first, last = math.ceil(lo / step), math.floor(hi / step)
    first += 1 if lo_open and first * step == lo else 0
    last -= 1 if hi_open and last * step == hi else 0
    if last - first >= MULTIPLES_MAX:
        return None
    return " | ".join(f'"{_decimal_text(k * step)}"' for k in range(first, last + 1)) or None


def integer_multiples(step: int, lo: int | None, hi: int | None) -> str | None:
    """Integers that are multiples of `step` in [lo, hi]: a multiple of a power of ten is any integer followed
    by its zeros; another step needs both bounds and at most MULTIPLES_MAX values (listed); None otherwise, or
    when none lies between the bounds."""
    zeros = len(str(step)) - len(str(step).rstrip("0"))
    if lo is None and hi is None and step == 10 ** zeros:
        return f'"0" | "-"? [1-9] [0-9]{{0,{INT_DIGITS_MAX - 1 - zeros}}} "{"0" * zeros}"'
    return _listed(Fraction(step), lo, False, hi, False)


def decimal_multiples(step: Fraction, lo, lo_open, hi, hi_open) -> str | None:
    """Numbers that are multiples of a step that is not whole (the module docstring's cases), in the bounds
    (None: open); None when the step is outside those cases or no multiple lies between the bounds."""
    digits = 0
    while (10 ** digits) % step.denominator:
        digits += 1
        if digits > FRAC_DIGITS_MAX:
            return None
    if step.numerator == 1 and step.denominator == 10 ** digits:   # 0.1, 0.01: at most `digits` of them
        return number_range(lo, lo_open, hi, hi_open, digits) or None
    listed = _listed(step, lo, lo_open, hi, hi_open)
    if listed is not None or step.numerator != 1:
        return listed
    return _fraction_multiples(step.denominator, lo, lo_open, hi, hi_open) or None


def _magnitude_multiples(n: int, lo: Fraction, lo_open: bool, hi: Fraction | None, hi_open: bool) -> str:
    """GBNF for unsigned multiples of 1/n in the bounds (0 <= lo; hi None: open), no exponent: the integer parts
    i whose every i + j/n is inside, with any of the n endings; the values of the (at most two or three)
    integer parts a bound cuts, listed."""
    def inside(x: Fraction) -> bool:
        return (x > lo or (x == lo and not lo_open)) and (hi is None or x < hi or (x == hi and not hi_open))
    top = Fraction(n - 1, n)
    ends = " | ".join(f'"{_decimal_text(Fraction(j, n))[1:]}"' for j in range(1, n))
    first = math.ceil(lo) + (1 if lo_open and lo == math.ceil(lo) else 0)
    last = None if hi is None else math.floor(hi - top) - (1 if hi_open and math.floor(hi - top) + top == hi else 0)
    alts = []
    if last is None or first <= last:
        alts.append(f"( {natural_range(first, last)} ) ( {ends} )?")
    edges = set(range(math.floor(lo), first)) | (set() if last is None else set(range(max(last + 1, math.floor(lo)),
                                                                                        math.floor(hi) + 1)))
    for i in sorted(edges):
        alts += [f'"{_decimal_text(i + Fraction(j, n))}"' for j in range(n) if inside(i + Fraction(j, n))]
    return " | ".join(alts)


def _fraction_multiples(n: int, lo, lo_open, hi, hi_open) -> str:
    """GBNF for the multiples of 1/n in the bounds (None: open): the non-negative part, then "-" and the
    magnitudes of the negative part (never "-0")."""
    alts = []
    if hi is None or hi > 0 or (hi == 0 and not hi_open):
        low = Fraction(0) if lo is None or lo < 0 else lo
        alts.append(_magnitude_multiples(n, low, lo_open and lo is not None and lo >= 0, hi, hi_open))
    if lo is None or lo < 0:
        bottom = Fraction(0) if hi is None or hi >= 0 else -hi
        neg = _magnitude_multiples(n, bottom, True if bottom == 0 else hi_open, None if lo is None else -lo,
                                   lo_open)
        if neg:
            alts.append(f'"-" ( {neg} )')
    return " | ".join(f"( {a} )" for a in alts if a)
