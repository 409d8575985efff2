"""The language tables of the synthetic TAPO world: names, nouns with their plural or counting
forms, and the question templates of each language (used by ``creditflow.tasks.tapo``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

# Object concepts shared by all languages; each language gives its own forms.
_CONCEPTS = ("pencil", "ticket", "banana", "candy", "envelope", "glass", "sock")
# Scenario keys double as template_id: the same key is the same story in every language.
_SCENARIOS = ("shop", "gift", "box", "collection", "school")


@dataclass(frozen=True)
class _Name:
    native: str
    english: str
    gender: str  # "f" or "m": picks the pronoun
    genitive: str = ""  # only Russian needs it ("У Анны есть ...")


@dataclass(frozen=True)
class _Template:
    """One story. ``intro`` uses {a}; ``add``/``sub`` use {Subj} and {b}; ``question`` uses {obj}."""

    intro: str
    add: str
    sub: str
    question: str


@dataclass(frozen=True)
class _Language:
    number_words: tuple[str, ...]  # index n -> the word for n, n = 0..20
    pronouns: Mapping[str, tuple[str, str]]  # gender -> (sentence-initial, inline)
    names: tuple[_Name, ...]
    objects: Mapping[str, Mapping[str, str]]  # concept -> forms; "q" is the "how many" form
    count: Callable[[int, str, Mapping[str, str]], str]  # (n, n as text, forms) -> "5 pencils"
    templates: Mapping[str, _Template]  # scenario -> template
    # variant="conflict": another owner's purchase, {name}/{name_gen} and the counted {d}.
    distractor: str
    sentence_separator: str = " "


def _plural_forms(
    plurals: Mapping[str, str], how: Mapping[str, str] | None = None
) -> dict[str, dict[str, str]]:
    """Forms for languages whose counted noun is just the plural (how = gendered 'how many')."""
    return {
        concept: {"pl": pl, "q": pl, **({"how": how[concept]} if how else {})}
        for concept, pl in plurals.items()
    }


def _romanised_names(spec: str) -> tuple[_Name, ...]:
    """``"Anna:f Tom:m"`` -> names that read the same in English (Latin-script languages)."""
    return tuple(_Name(n, n, g) for n, g in (item.split(":") for item in spec.split()))


def _count_number_first(n: int, text: str, forms: Mapping[str, str]) -> str:
    return f"{text} {forms['pl']}"


def _count_ru(n: int, text: str, forms: Mapping[str, str]) -> str:
    # Russian numeral government: 1, 21, 31 ... take the nominative singular, 2-4 (not 12-14)
    # the genitive singular, everything else the genitive plural.
    if n % 10 == 1 and n % 100 != 11:
        return f"{text} {forms['one']}"
    if 2 <= n % 10 <= 4 and not 12 <= n % 100 <= 14:
        return f"{text} {forms['few']}"
    return f"{text} {forms['many']}"


def _count_zh(n: int, text: str, forms: Mapping[str, str]) -> str:
    return f"{text}{forms['cls']}{forms['noun']}"


def _count_sw(n: int, text: str, forms: Mapping[str, str]) -> str:
    return f"{forms['noun']} {text}"


_EN = _Language(
    number_words=(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen "
        "fourteen fifteen sixteen seventeen eighteen nineteen twenty"
    ).split(),
    pronouns={"f": ("She", "she"), "m": ("He", "he")},
    names=_romanised_names("Anna:f Tom:m Lucy:f James:m Emma:f Jack:m"),
    objects=_plural_forms(
        {
            "pencil": "pencils",
            "ticket": "tickets",
            "banana": "bananas",
            "candy": "candies",
            "envelope": "envelopes",
            "glass": "glasses",
            "sock": "socks",
        }
    ),
    count=_count_number_first,
    templates={
        "shop": _Template(
            "{name} has {a}.",
            "{Subj} buys {b}.",
            "{Subj} sells {b}.",
            "How many {obj} does {name} have now?",
        ),
        "gift": _Template(
            "{name} has {a}.",
            "{Subj} gets {b} from a friend.",
            "{Subj} gives {b} to a friend.",
            "How many {obj} does {name} have in the end?",
        ),
        "box": _Template(
            "There are {a} in a box.",
            "{Subj} puts {b} into the box.",
            "{Subj} takes {b} out of the box.",
            "How many {obj} are in the box now?",
        ),
        "collection": _Template(
            "{name} has a collection of {a}.",
            "{Subj} finds {b}.",
            "{Subj} loses {b}.",
            "How many {obj} are in {name}'s collection now?",
        ),
        "school": _Template(
            "{name} brings {a} to school.",
            "{Subj} gets {b} from the teacher.",
            "{Subj} gives {b} to classmates.",
            "How many {obj} does {name} have now?",
        ),
    },
    distractor="{name}'s neighbor buys {d}.",
)

_DE = _Language(
    number_words=(
        "null eins zwei drei vier fünf sechs sieben acht neun zehn elf zwölf dreizehn "
        "vierzehn fünfzehn sechzehn siebzehn achtzehn neunzehn zwanzig"
    ).split(),
    pronouns={"f": ("Sie", "sie"), "m": ("Er", "er")},
    names=_romanised_names("Lena:f Jonas:m Marie:f Paul:m Hanna:f Felix:m"),
    objects=_plural_forms(
        {
            "pencil": "Bleistifte",
            "ticket": "Tickets",
            "banana": "Bananen",
            "candy": "Bonbons",
            "envelope": "Briefumschläge",
            "glass": "Gläser",
            "sock": "Socken",
        }
    ),
    count=_count_number_first,
    # Counted nouns only in nominative/accusative plural (no dative "mit ... Bleistiften").
    templates={
        "shop": _Template(
            "{name} hat {a}.",
            "{Subj} kauft {b}.",
            "{Subj} verkauft {b}.",
            "Wie viele {obj} hat {name} jetzt?",
        ),
        "gift": _Template(
            "{name} hat {a}.",
            "{Subj} bekommt {b} von einem Freund.",
            "{Subj} schenkt einem Freund {b}.",
            "Wie viele {obj} hat {name} am Ende?",
        ),
        "box": _Template(
            "In einer Kiste liegen {a}.",
            "{Subj} legt {b} in die Kiste.",
            "{Subj} nimmt {b} aus der Kiste.",
            "Wie viele {obj} liegen jetzt in der Kiste?",
        ),
        "collection": _Template(
            "In der Sammlung von {name} sind {a}.",
            "{Subj} findet {b}.",
            "{Subj} verliert {b}.",
            "Wie viele {obj} sind jetzt in der Sammlung von {name}?",
        ),
        "school": _Template(
            "{name} bringt {a} in die Schule.",
            "{Subj} bekommt {b} von der Lehrerin.",
            "{Subj} gibt den Mitschülern {b}.",
            "Wie viele {obj} hat {name} jetzt?",
        ),
    },
    distractor="Der Nachbar von {name} kauft {d}.",
)

_ES_PLURALS = {
    "pencil": "lápices",
    "ticket": "boletos",
    "banana": "plátanos",
    "candy": "caramelos",
    "envelope": "sobres",
    "glass": "vasos",
    "sock": "calcetines",
}
_ES = _Language(
    number_words=(
        "cero uno dos tres cuatro cinco seis siete ocho nueve diez once doce trece catorce "
        "quince dieciséis diecisiete dieciocho diecinueve veinte"
    ).split(),
    pronouns={"f": ("Ella", "ella"), "m": ("Él", "él")},
    names=_romanised_names("Lucía:f Pablo:m Sofía:f Diego:m Carmen:f Javier:m"),
    # All Spanish nouns here are masculine, hence "Cuántos" throughout.
    objects=_plural_forms(_ES_PLURALS, how=dict.fromkeys(_ES_PLURALS, "Cuántos")),
    count=_count_number_first,
    templates={
        "shop": _Template(
            "{name} tiene {a}.",
            "{Subj} compra {b}.",
            "{Subj} vende {b}.",
            "¿{how} {obj} tiene {name} ahora?",
        ),
        "gift": _Template(
            "{name} tiene {a}.",
            "{Subj} recibe {b} de un amigo.",
            "{Subj} le regala {b} a un amigo.",
            "¿{how} {obj} tiene {name} al final?",
        ),
        "box": _Template(
            "Hay {a} en una caja.",
            "{Subj} mete {b} en la caja.",
            "{Subj} saca {b} de la caja.",
            "¿{how} {obj} hay ahora en la caja?",
        ),
        "collection": _Template(
            "{name} tiene una colección de {a}.",
            "{Subj} encuentra {b}.",
            "{Subj} pierde {b}.",
            "¿{how} {obj} hay ahora en la colección de {name}?",
        ),
        "school": _Template(
            "{name} lleva {a} a la escuela.",
            "{Subj} recibe {b} de la maestra.",
            "{Subj} les da {b} a sus compañeros.",
            "¿{how} {obj} tiene {name} ahora?",
        ),
    },
    distractor="El vecino de {name} compra {d}.",
)

_FR_PLURALS = {
    "pencil": "crayons",
    "ticket": "billets",
    "banana": "bananes",
    "candy": "bonbons",
    "envelope": "enveloppes",
    "glass": "verres",
    "sock": "chaussettes",
}
_FR = _Language(
    number_words=(
        "zéro un deux trois quatre cinq six sept huit neuf dix onze douze treize quatorze "
        "quinze seize dix-sept dix-huit dix-neuf vingt"
    ).split(),
    pronouns={"f": ("Elle", "elle"), "m": ("Il", "il")},
    names=_romanised_names("Camille:f Lucas:m Chloé:f Hugo:m Léa:f Louis:m"),
    # "Combien de" elides before a vowel ("combien d'enveloppes"), so "q" carries the article.
    objects={
        concept: {"pl": pl, "q": ("d'" if pl[0] in "aeiouyé" else "de ") + pl}
        for concept, pl in _FR_PLURALS.items()
    },
    count=_count_number_first,
    templates={
        "shop": _Template(
            "{name} a {a}.",
            "{Subj} achète {b}.",
            "{Subj} vend {b}.",
            "Combien {obj} {name} a-t-{pron} maintenant ?",
        ),
        "gift": _Template(
            "{name} a {a}.",
            "{Subj} reçoit {b} d'un ami.",
            "{Subj} donne {b} à un ami.",
            "Combien {obj} {name} a-t-{pron} à la fin ?",
        ),
        "box": _Template(
            "Il y a {a} dans une boîte.",
            "{Subj} met {b} dans la boîte.",
            "{Subj} retire {b} de la boîte.",
            "Combien {obj} y a-t-il maintenant dans la boîte ?",
        ),
        "collection": _Template(
            "{name} a une collection de {a}.",
            "{Subj} trouve {b}.",
            "{Subj} perd {b}.",
            "Combien {obj} y a-t-il maintenant dans la collection de {name} ?",
        ),
        "school": _Template(
            "{name} apporte {a} à l'école.",
            "{Subj} reçoit {b} de la maîtresse.",
            "{Subj} donne {b} à ses camarades.",
            "Combien {obj} {name} a-t-{pron} maintenant ?",
        ),
    },
    distractor="Le voisin de {name} achète {d}.",
)

_IT_PLURALS = {
    "pencil": ("matite", "Quante"),
    "ticket": ("biglietti", "Quanti"),
    "banana": ("banane", "Quante"),
    "candy": ("caramelle", "Quante"),
    "envelope": ("buste", "Quante"),
    "glass": ("bicchieri", "Quanti"),
    "sock": ("calzini", "Quanti"),
}
_IT = _Language(
    number_words=(
        "zero uno due tre quattro cinque sei sette otto nove dieci undici dodici tredici "
        "quattordici quindici sedici diciassette diciotto diciannove venti"
    ).split(),
    pronouns={"f": ("Lei", "lei"), "m": ("Lui", "lui")},
    names=_romanised_names("Giulia:f Marco:m Chiara:f Luca:m Sara:f Matteo:m"),
    # "Quanti/Quante" agrees with the noun's gender.
    objects=_plural_forms(
        {c: pl for c, (pl, _) in _IT_PLURALS.items()},
        how={c: how for c, (_, how) in _IT_PLURALS.items()},
    ),
    count=_count_number_first,
    templates={
        "shop": _Template(
            "{name} ha {a}.",
            "{Subj} compra {b}.",
            "{Subj} vende {b}.",
            "{how} {obj} ha {name} adesso?",
        ),
        "gift": _Template(
            "{name} ha {a}.",
            "{Subj} riceve {b} da un amico.",
            "{Subj} regala {b} a un amico.",
            "{how} {obj} ha {name} alla fine?",
        ),
        "box": _Template(
            "In una scatola ci sono {a}.",
            "{Subj} mette {b} nella scatola.",
            "{Subj} toglie {b} dalla scatola.",
            "{how} {obj} ci sono adesso nella scatola?",
        ),
        "collection": _Template(
            "{name} ha una collezione di {a}.",
            "{Subj} trova {b}.",
            "{Subj} perde {b}.",
            "{how} {obj} ci sono adesso nella collezione di {name}?",
        ),
        "school": _Template(
            "{name} porta {a} a scuola.",
            "{Subj} riceve {b} dalla maestra.",
            "{Subj} dà {b} ai compagni.",
            "{how} {obj} ha {name} adesso?",
        ),
    },
    distractor="Il vicino di {name} compra {d}.",
)

_RU_FORMS = {  # nominative singular, genitive singular (2-4), genitive plural (5-20)
    "pencil": ("карандаш", "карандаша", "карандашей"),
    "ticket": ("билет", "билета", "билетов"),
    "banana": ("банан", "банана", "бананов"),
    "candy": ("леденец", "леденца", "леденцов"),
    "envelope": ("конверт", "конверта", "конвертов"),
    "glass": ("стакан", "стакана", "стаканов"),
    "sock": ("носок", "носка", "носков"),
}
_RU = _Language(
    number_words=(
        "ноль один два три четыре пять шесть семь восемь девять десять одиннадцать "
        "двенадцать тринадцать четырнадцать пятнадцать шестнадцать семнадцать "
        "восемнадцать девятнадцать двадцать"
    ).split(),
    pronouns={"f": ("Она", "она"), "m": ("Он", "он")},
    names=(
        _Name("Анна", "Anna", "f", "Анны"),
        _Name("Иван", "Ivan", "m", "Ивана"),
        _Name("Мария", "Maria", "f", "Марии"),
        _Name("Дмитрий", "Dmitry", "m", "Дмитрия"),
        _Name("Ольга", "Olga", "f", "Ольги"),
        _Name("Павел", "Pavel", "m", "Павла"),
    ),
    # Masculine inanimate nouns only: accusative = nominative, and "два" fits without agreement.
    objects={
        concept: {"one": one, "few": few, "many": many, "q": many}
        for concept, (one, few, many) in _RU_FORMS.items()
    },
    count=_count_ru,
    # Present tense throughout: Russian past-tense verbs agree with the subject's gender.
    templates={
        "shop": _Template(
            "У {name_gen} есть {a}.",
            "{Subj} покупает {b}.",
            "{Subj} продаёт {b}.",
            "Сколько {obj} теперь у {name_gen}?",
        ),
        "gift": _Template(
            "У {name_gen} есть {a}.",
            "{Subj} получает {b} от друга.",
            "{Subj} дарит другу {b}.",
            "Сколько {obj} в итоге у {name_gen}?",
        ),
        "box": _Template(
            "В коробке {a}.",
            "{Subj} кладёт в коробку {b}.",
            "{Subj} достаёт из коробки {b}.",
            "Сколько {obj} теперь в коробке?",
        ),
        "collection": _Template(
            "В коллекции {name_gen} {a}.",
            "{Subj} находит {b}.",
            "{Subj} теряет {b}.",
            "Сколько {obj} теперь в коллекции {name_gen}?",
        ),
        "school": _Template(
            "{name} приносит в школу {a}.",
            "{Subj} получает {b} от учительницы.",
            "{Subj} отдаёт одноклассникам {b}.",
            "Сколько {obj} теперь у {name_gen}?",
        ),
    },
    distractor="Сосед {name_gen} покупает {d}.",
)

_ZH_FORMS = {  # measure word, noun
    "pencil": ("支", "铅笔"),
    "ticket": ("张", "票"),
    "banana": ("根", "香蕉"),
    "candy": ("颗", "糖"),
    "envelope": ("个", "信封"),
    "glass": ("个", "玻璃杯"),
    "sock": ("只", "袜子"),
}
_ZH = _Language(
    # Counting form: 2 before a measure word is 两, not 二 (12 and 20 keep 二).
    number_words=tuple(
        "零 一 两 三 四 五 六 七 八 九 十 十一 十二 十三 十四 十五 十六 十七 十八 十九 二十".split()
    ),
    pronouns={"f": ("她", "她"), "m": ("他", "他")},
    names=(
        _Name("小红", "Xiaohong", "f"),
        _Name("小明", "Xiaoming", "m"),
        _Name("王芳", "Wang Fang", "f"),
        _Name("李伟", "Li Wei", "m"),
        _Name("张丽", "Zhang Li", "f"),
        _Name("刘洋", "Liu Yang", "m"),
    ),
    objects={
        concept: {"cls": cls, "noun": noun, "q": cls + noun}
        for concept, (cls, noun) in _ZH_FORMS.items()
    },
    count=_count_zh,
    templates={
        "shop": _Template(
            "{name}有{a}。",
            "{Subj}又买了{b}。",
            "{Subj}卖掉了{b}。",
            "{name}现在有多少{obj}？",
        ),
        "gift": _Template(
            "{name}有{a}。",
            "{Subj}从朋友那里得到了{b}。",
            "{Subj}送给朋友{b}。",
            "{name}最后有多少{obj}？",
        ),
        "box": _Template(
            "一个盒子里有{a}。",
            "{Subj}往盒子里放了{b}。",
            "{Subj}从盒子里拿出了{b}。",
            "现在盒子里有多少{obj}？",
        ),
        "collection": _Template(
            "{name}收藏了{a}。",
            "{Subj}又找到了{b}。",
            "{Subj}丢了{b}。",
            "{name}现在收藏了多少{obj}？",
        ),
        "school": _Template(
            "{name}带了{a}去学校。",
            "{Subj}从老师那里得到了{b}。",
            "{Subj}分给同学{b}。",
            "{name}现在有多少{obj}？",
        ),
    },
    distractor="{name}的邻居买了{d}。",
    sentence_separator="",  # Chinese runs sentences together after the full-width stop
)

_SW = _Language(
    number_words=(
        "sifuri",
        "moja",
        "mbili",
        "tatu",
        "nne",
        "tano",
        "sita",
        "saba",
        "nane",
        "tisa",
        "kumi",
        *(
            f"kumi na {unit}"
            for unit in ("moja", "mbili", "tatu", "nne", "tano", "sita", "saba", "nane", "tisa")
        ),
        "ishirini",
    ),
    # Verbs carry the subject prefix; "Yeye" (he/she) is not gendered.
    pronouns={"f": ("Yeye", "yeye"), "m": ("Yeye", "yeye")},
    names=_romanised_names("Amina:f Juma:m Neema:f Baraka:m Zawadi:f Hamisi:m"),
    # N-class (9/10) nouns only: their numbers take no class prefix ("penseli tano").
    objects={
        concept: {"noun": noun, "q": noun}
        for concept, noun in {
            "pencil": "penseli",
            "ticket": "tiketi",
            "banana": "ndizi",
            "candy": "pipi",
            "envelope": "bahasha",
            "glass": "glasi",
            "sock": "soksi",
        }.items()
    },
    count=_count_sw,
    templates={
        "shop": _Template(
            "{name} ana {a}.",
            "{Subj} ananunua {b}.",
            "{Subj} anauza {b}.",
            "{name} ana {obj} ngapi sasa?",
        ),
        "gift": _Template(
            "{name} ana {a}.",
            "{Subj} anapokea {b} kutoka kwa rafiki.",
            "{Subj} anampa rafiki {b}.",
            "{name} ana {obj} ngapi mwishoni?",
        ),
        "box": _Template(
            "Kuna {a} ndani ya sanduku.",
            "{Subj} anaweka {b} ndani ya sanduku.",
            "{Subj} anatoa {b} kutoka sandukuni.",
            "Kuna {obj} ngapi ndani ya sanduku sasa?",
        ),
        "collection": _Template(
            "{name} ana mkusanyiko wa {a}.",
            "{Subj} anaokota {b}.",
            "{Subj} anapoteza {b}.",
            "Kuna {obj} ngapi katika mkusanyiko wa {name} sasa?",
        ),
        "school": _Template(
            "{name} analeta {a} shuleni.",
            "{Subj} anapokea {b} kutoka kwa mwalimu.",
            "{Subj} anawapa wanafunzi wenzake {b}.",
            "{name} ana {obj} ngapi sasa?",
        ),
    },
    distractor="Jirani wa {name} ananunua {d}.",
)

_LANGUAGES: Mapping[str, _Language] = MappingProxyType(
    {"en": _EN, "de": _DE, "es": _ES, "fr": _FR, "it": _IT, "ru": _RU, "zh": _ZH, "sw": _SW}
)
