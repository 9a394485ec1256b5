"""Distillation prompts for ``specbuild draft``, made locally: never hub data, never the benchmark set.

The target answers these prompts and a draft learns from its answers. They cover the same kinds of
request as the bundled benchmark (chat, code, summarization, reasoning, extraction) but are composed here
from templates, topics and seeded numbers, plus passages and functions from the Python standard library's
own source (local text every machine has). Any prompt that equals a bundled benchmark prompt is dropped,
so the benchmark stays held out.
"""

from __future__ import annotations

import ast
import random
import sysconfig
from pathlib import Path

TOPICS = (
    "photosynthesis", "the water cycle", "volcanoes", "black holes", "the Roman Empire", "vaccines",
    "electric cars", "compound interest", "sleep", "meditation", "recycling", "coffee", "the stock market",
    "bees", "the internet", "solar panels", "chess", "jazz music", "the moon landing", "earthquakes",
    "time management", "public speaking", "learning a language", "gardening", "remote work", "budgeting",
    "rainbows", "the human heart", "dinosaurs", "the printing press", "cloud computing", "encryption",
    "machine learning", "databases", "open source software", "climate change", "the Olympic Games",
    "bread baking", "running a marathon", "friendship", "the French Revolution", "tides", "glaciers",
    "antibiotics", "credit scores", "3D printing", "the immune system", "renewable energy", "origami",
    "cats", "dogs as pets", "houseplants", "camping", "cycling to work", "healthy breakfasts", "tea",
    "the Great Wall of China", "the pyramids of Giza", "honey", "owls", "octopuses", "coral reefs",
    "the rainforest", "deserts", "hurricanes", "lightning", "magnets", "gravity", "the speed of light",
    "electricity at home", "batteries", "smartphones", "passwords", "email etiquette", "job interviews",
    "writing a CV", "saving for retirement", "renting an apartment", "moving to a new city", "cooking rice",
    "making pizza at home", "learning to swim", "yoga", "stretching", "drinking water", "noise at night",
    "neighbours", "volunteering", "board games", "photography", "painting with watercolours", "the guitar",
    "the piano", "reading more books", "keeping a journal", "procrastination", "stress at work",
    "teamwork", "giving feedback", "online privacy", "spreadsheets", "the Python programming language",
    "version control with git", "unit testing", "APIs", "web browsers", "video games", "electric bikes",
    "trains", "airplanes", "the Moon", "Mars", "the Sun", "the ocean", "rivers", "forests", "wolves",
    "elephants", "penguins", "bread", "cheese", "chocolate", "vegetables", "a birthday party",
)
CHAT = (
    "What is {t}?", "Explain {t} in simple terms.", "Give me three interesting facts about {t}.",
    "Why does {t} matter?", "Explain {t} to a ten-year-old.", "What are common misconceptions about {t}?",
    "Write a short paragraph about {t}.", "What are the pros and cons of {t}?",
    "How would you describe {t} to a friend?", "Write a short poem about {t}.",
    "What should a beginner know about {t}?", "Give me a few tips related to {t}.",
    "Can you tell me about {t}?", "I am curious about {t}. Where should I start?",
    "Write a short story that involves {t}.", "Summarize what people usually get wrong about {t}.",
    "What is the history of {t}, briefly?", "List five questions a student might ask about {t}.",
    "Suggest a name for a blog about {t}.", "How do experts think about {t}?",
)
CODE_TASKS = (
    "reverses a string", "counts the vowels in a string", "checks whether a number is prime",
    "returns the n-th Fibonacci number", "flattens a nested list", "removes duplicates from a list while "
    "keeping order", "computes the average of a list of numbers", "finds the largest word in a sentence",
    "converts Celsius to Fahrenheit", "reads a text file and counts its lines", "sorts a list of "
    "dictionaries by a key", "returns the greatest common divisor of two numbers", "checks if two strings "
    "are anagrams", "capitalizes every word in a sentence", "computes the factorial of n iteratively",
    "groups words by their first letter", "finds the second smallest number in a list",
    "validates an email address with a simple check", "merges two dictionaries", "transposes a matrix",
)
CODE = (
    "Write a Python function that {task}.", "Write a short Python program that {task}, with a docstring.",
    "How would you write a function in Python that {task}? Explain briefly.",
    "Write a JavaScript function that {task}.", "In Python, how do I write code that {task}?",
    "Write a Python function that {task}, and add two test cases.",
    "Give me a one-line Python expression or function that {task}.",
)
NAMES = ("Alice", "Ben", "Chloe", "David", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Kenji", "Lena")
CITIES = ("Lisbon", "Oslo", "Nairobi", "Toronto", "Osaka", "Lyon", "Dublin", "Austin", "Krakow", "Perth")
ITEMS = ("books", "pencils", "oranges", "tickets", "cookies", "stamps", "marbles", "plants")


def distillation_prompts(count: int, seed: int = 0, exclude: frozenset[str] = frozenset()) -> list[str]:
    """``count`` distinct user prompts (fewer if the templates run out), shuffled with ``seed``."""
    rng = random.Random(seed)
    pool = {prompt for prompt in (_chat() + _code() + _reasoning(rng) + _extraction(rng) + _from_stdlib(rng))
            if prompt not in exclude}
    ordered = sorted(pool)
    rng.shuffle(ordered)
    return ordered[:count]


def _chat() -> list[str]:
    return [template.format(t=topic) for topic in TOPICS for template in CHAT]


def _code() -> list[str]:
    return [template.format(task=task) for task in CODE_TASKS for template in CODE]


def _reasoning(rng: random.Random, count: int = 600) -> list[str]:
    prompts = []
    for _ in range(count):
        name, item = rng.choice(NAMES), rng.choice(ITEMS)
        a, b, c = rng.randint(3, 60), rng.randint(2, 12), rng.randint(2, 9)
        prompts.append(rng.choice((
            f"{name} has {a} {item}, buys {b} more and then gives away {c}. How many {item} are left? "
            "Explain step by step.",
            f"A box holds {b} {item}. How many boxes are needed for {a * c} {item}? Show your reasoning.",
            f"A train travels {a * 10} km in {b} hours. What is its average speed?",
            f"If {name} saves {b} dollars a week, how many weeks until {name} has {a * b} dollars?",
            f"What is {a} multiplied by {b}, minus {c}? Think it through.",
            f"A meeting starts at {b}:{c}0 and lasts {a} minutes. When does it end? Explain your steps.",
            f"{name} is older than {rng.choice(NAMES)}, who is older than {rng.choice(NAMES)}. Who is the "
            "youngest? Explain.",
            f"A shop sells {item} at {b} for {a} euros. How much do {b * c} {item} cost?",
            f"If {c} people share {a * c} {item} equally, how many does each get? Explain.",
        )))
    return prompts


def _extraction(rng: random.Random, count: int = 500) -> list[str]:
    prompts = []
    for _ in range(count):
        first, second = rng.sample(NAMES, 2)
        city, item = rng.choice(CITIES), rng.choice(ITEMS)
        text = (f"On {rng.randint(1, 28)} March, {first} met {second} in {city} and sold "
                f"{rng.randint(2, 90)} {item} for {rng.randint(5, 400)} euros.")
        prompts.append(rng.choice((
            f"Extract the names, the city and the numbers from this sentence:\n\n{text}",
            f"List every person mentioned in this text and what they did:\n\n{text}",
            f"Turn this sentence into JSON with the fields date, people, city, quantity and price:\n\n{text}",
            f"Extract the names of all people mentioned in this text, as a comma-separated list:\n\n{text}",
            f"What city and what date are mentioned in this text?\n\n{text}",
        )))
    return prompts


SUMMARIZE = ("Summarize this documentation in two sentences:\n\n{text}",
             "Summarize the following text in two sentences.\n\n{text}",
             "Write a one-sentence summary of this passage.\n\n{text}",
             "What are the key points of this text? Use a short list.\n\n{text}")
EXPLAIN = ("Explain what this Python function does:\n\n{code}", "What does this code do? Answer briefly.\n\n{code}",
           "Suggest one improvement to this Python function:\n\n{code}")


def _from_stdlib(rng: random.Random, limit: int = 2500) -> list[str]:
    """Summaries of docstrings (modules, classes, functions) and explanations of short functions from the
    standard library, subpackages included (tests skipped)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    prompts: list[str] = []
    for path in sorted(stdlib.rglob("*.py")):
        if {"test", "tests", "site-packages", "idle_test"} & set(path.relative_to(stdlib).parts):
            continue
        try:
            source = path.read_text(encoding="utf-8", errors="replace")
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        documented = [tree, *(node for node in ast.walk(tree)
                               if isinstance(node, (ast.ClassDef, ast.FunctionDef)))]
        for node in documented:
            docstring = ast.get_docstring(node) or ""
            if 200 <= len(docstring) <= 900:
                prompts.append(rng.choice(SUMMARIZE).format(text=docstring))
        functions = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                     and node.end_lineno is not None and 3 <= node.end_lineno - node.lineno <= 12]
        for node in rng.sample(functions, min(3, len(functions))):
            segment = ast.get_source_segment(source, node)
            if segment:
                prompts.append(rng.choice(EXPLAIN).format(code=segment))
        if len(prompts) >= limit:
            break
    return prompts
