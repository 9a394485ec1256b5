"""Distillation prompts for ``specbuild draft``, made locally: never hub data, never a benchmark prompt.

The target answers these prompts and a draft learns from its answers, so their variety bounds how well the
draft agrees on requests it never saw (GPU-distilled drafts agreed far less on held-out prompts than on their
own). The pool crosses instruction templates of many kinds (:data:`KINDS`: chat, follow-ups, e-mails, how-to
steps, brainstorming, comparisons, summaries and one-sentence summaries, rewriting, translation, extraction,
classification, questions on a passage, code, reasoning) with topics, seeded numbers and names, and passages
of local text (:mod:`specbuild.bench.passages`: the standard library, installed packages, Debian's docs).

Every benchmark prompt is held out, and so is every pool prompt too similar to one (:mod:`specbuild.drafts.held_out`).
The pool is deduplicated and, for a seed, the same on a given machine; a short run sees every kind
(:func:`distillation_prompts`).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType

from specbuild.bench.passages import DEBIAN_DOC, Passage, local_passages, stdlib_functions
from specbuild.drafts.held_out import benchmark_prompts, too_similar

KINDS_PER_PASSAGE = 2

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
    "public libraries", "museums", "composting", "bird watching", "knitting", "podcasts", "city parks",
    "public transport", "first aid", "fire safety", "saving energy at home", "online shopping", "inflation",
    "small businesses", "customer service", "negotiating a salary", "mentoring", "onboarding new staff",
    "project deadlines", "meetings", "working from a café", "learning to code", "debugging", "spam e-mail",
    "backups", "Wi-Fi at home", "operating systems", "the Linux command line", "regular expressions",
    "the metric system", "leap years", "time zones", "maps", "volcanic islands", "the Arctic", "soil",
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
    "Hi! I have a quick question about {t}: why do people care about it?", "Tell me something surprising about {t}.",
    "I only have a minute. What is the one thing to know about {t}?", "Is {t} overrated? Give a balanced view.",
)
FOLLOW_UP = (
    "You explained {t} to me earlier, but I still don't get it. Can you try again with an everyday example?",
    "Thanks for the tips on {t}. Which one should I try first, and why?",
    "My friend says {t} is overrated. How could I answer that politely?",
    "Earlier you said {t} is complicated. Can you break it into three simple parts?",
    "Following up on our chat about {t}: what is one small thing I can do about it today?",
    "Okay, that makes sense. Now can you explain {t} in one short paragraph for my notes?",
    "Here is our conversation so far:\nMe: What is {t}?\nYou: It is a big subject, but the basics are simple.\n"
    "Me: Great, give me the basics in three sentences.",
    "I asked about {t} yesterday and got a long answer. Can you give me the short version?",
    "Wait, I think I misunderstood {t}. What is the most common mistake people make about it?",
    "That was helpful, thanks! One more question about {t}: where can a beginner learn more?",
)
BRAINSTORM = (
    "Brainstorm ten ideas for a school project about {t}.", "Give me five creative titles for an article about {t}.",
    "List six questions I could ask an expert on {t}.", "Suggest three ways a small town could get involved in {t}.",
    "Come up with five fun weekend activities related to {t}.", "Brainstorm names for a podcast about {t}.",
    "Give me three ideas for a short video that explains {t}.", "Suggest a few gift ideas for someone who loves {t}.",
    "List five ways to make {t} more interesting for teenagers.", "Brainstorm slogans for a campaign about {t}.",
)
PAIRS = (
    ("tea", "coffee"), ("trains", "airplanes"), ("cats", "dogs"), ("Python", "JavaScript"),
    ("renting", "buying a home"),
    ("running", "swimming"), ("e-books", "paper books"), ("solar power", "wind power"), ("a laptop", "a tablet"),
    ("working from home", "working in an office"), ("lists", "dictionaries in Python"), ("SQL", "NoSQL databases"),
    ("meditation", "exercise"), ("saving", "investing"), ("a city", "the countryside"), ("weather", "climate"),
    ("viruses", "bacteria"), ("bicycles", "electric scooters"), ("git merge", "git rebase"), ("TCP", "UDP"),
    ("a debit card", "a credit card"), ("baking", "frying"), ("chess", "checkers"), ("the piano", "the guitar"),
    ("hiking", "cycling"), ("Mars", "Venus"), ("owls", "hawks"), ("butter", "olive oil"),
    ("e-mail", "instant messaging"),
    ("threads", "processes"), ("Linux", "Windows"), ("HTTP", "HTTPS"),
    ("a résumé", "a cover letter"), ("frogs", "toads"), ("rivers", "canals"), ("glaciers", "icebergs"),
    ("compilers", "interpreters"), ("unit tests", "integration tests"), ("a budget airline", "a night train"),
)
COMPARISON = (
    "Compare {a} and {b}.", "What is the difference between {a} and {b}? Keep it brief.",
    "{A} or {b}: which would you recommend for a beginner, and why?", "Make a short table comparing {a} and {b}.",
    "What do {a} and {b} have in common?", "Give two advantages of {a} over {b}, and two of {b} over {a}.",
    "In a few sentences, when should I choose {a} instead of {b}?",
)
HOWTO_TASKS = (
    "make a good cup of tea", "change a flat bicycle tyre", "plan a small birthday party", "start a vegetable garden",
    "write a cover letter", "prepare for a job interview", "back up the photos on my phone", "learn to touch type",
    "clean a cast-iron pan", "set up a monthly budget", "train for a 5 km run", "make bread without a machine",
    "organise a messy wardrobe", "write a good bug report", "set up a Python virtual environment",
    "undo my last git commit", "make a simple website", "cook rice on the stove", "repot a houseplant",
    "prepare a short presentation", "pack a suitcase efficiently", "learn a new language on my own",
    "keep a houseplant alive while on holiday", "choose a strong password", "hang a picture straight",
    "write a thank-you note", "brew cold coffee at home", "fix a dripping tap", "make a study timetable",
    "plan a road trip", "host a board game night", "start journaling", "reduce food waste at home",
    "give constructive feedback to a colleague", "run a short team meeting", "negotiate a lower phone bill",
    "make a paper airplane that flies far", "install a program on Linux", "read a nutrition label",
)
HOWTO = (
    "How do I {h}? Give step-by-step instructions.", "What are the steps to {h}?",
    "Explain how to {h}, for a complete beginner.", "I want to {h}. Where do I start?",
    "Write a short checklist for how to {h}.", "What mistakes should I avoid when I {h}?",
    "Can you walk me through how to {h}, one step at a time?",
)
RECIPIENTS = ("my manager", "a colleague", "my landlord", "a customer", "my child's teacher", "a neighbour",
              "a friend", "the IT help desk", "a new client", "my team", "a hotel", "a job recruiter")
PURPOSES = (
    "asking to move our meeting to Thursday", "thanking them for their help last week", "apologising for a late reply",
    "declining an invitation to dinner", "asking for a day off next Monday", "reporting a broken heater",
    "confirming the details of an order", "following up on an unanswered question", "introducing myself",
    "asking for feedback on a report", "sharing the agenda for tomorrow", "asking for a refund",
    "saying I will be ten minutes late", "inviting them to a small farewell party", "requesting a copy of an invoice",
)
EMAIL = (
    "Write a short e-mail to {r} {p}.", "Draft a polite message to {r} {p}.",
    "Write a brief, friendly text message to {r} {p}.", "Write a formal e-mail to {r} {p}. Keep it under 100 words.",
    "Help me write a two-sentence note to {r} {p}.", "Write an e-mail with a clear subject line to {r} {p}.",
)
SUMMARY = (
    "Summarize the following text in two sentences.\n\n{text}",
    "Summarize this documentation in two sentences:\n\n{text}",
    "What are the key points of this text? Use a short list.\n\n{text}",
    "Give three bullet points that summarize this text:\n\n{text}",
    "Summarize the main points of this text for someone who has no time to read it:\n\n{text}",
    "TL;DR this for me:\n\n{text}", "Summarize this passage for a beginner, in plain words:\n\n{text}",
    "Write a short summary of this text and say who it is useful for.\n\n{text}",
)
ONE_SENTENCE = (
    "Write a one-sentence summary of this passage.\n\n{text}",
    "In one sentence, what is this paragraph about?\n\n{text}",
    "Summarize in one sentence: {text}", "Give a one-line summary of this text:\n\n{text}",
    "What is the main idea of this text? Answer in one sentence.\n\n{text}",
    "Sum this up in a single sentence:\n\n{text}", "Write a headline for this paragraph.\n\n{text}",
)
REWRITE = (
    "Rewrite this text in plain English for a beginner:\n\n{text}",
    "Make this paragraph shorter without losing any information:\n\n{text}",
    "Rewrite this passage as a friendly note to a colleague:\n\n{text}",
    "Fix any grammar or style problems in this text and give the improved version:\n\n{text}",
    "Rewrite this in a more formal tone:\n\n{text}", "Turn this paragraph into a numbered list of points:\n\n{text}",
    "Rewrite this as a short e-mail to my team:\n\n{text}",
    "Explain this text as if talking to a ten-year-old:\n\n{text}",
)
EXTRACT = (
    "List the technical terms used in this text:\n\n{text}",
    "Extract every function, option or file name mentioned in this text, as a list:\n\n{text}",
    "What does this text tell the reader to do or not to do? List each point.\n\n{text}",
    "Extract the key facts from this passage as a bullet list.\n\n{text}",
    "Which names, numbers or values appear in this text? List them.\n\n{text}",
    "Turn the main facts of this text into a JSON object.\n\n{text}",
)
CLASSIFY = (
    "Which topic best describes this text: programming, networking, security, files, mathematics, text or "
    "something else? Answer with the topic and one reason.\n\n{text}",
    "Is the tone of this passage formal or informal? Explain in one sentence.\n\n{text}",
    "Who is this text written for: beginners, experienced users or developers? Explain briefly.\n\n{text}",
    "Is this text a description, an instruction or a warning? Answer in one word, then explain.\n\n{text}",
    "Label this text with three keywords.\n\n{text}",
)
QUESTIONS = ("What is this text mainly about?", "What problem does the described thing solve?",
             "What happens by default, according to the text?", "What should the reader be careful about?",
             "Who would need this?", "What is the most important detail here?", "What example does the text give?")
GROUNDED = (
    "Answer using only the passage below.\n\nPassage: {text}\n\nQuestion: {q}",
    "Read this text and answer: {q}\n\n{text}",
    "{text}\n\nBased on the text above: {q}", "Write two questions a reader could answer from this text, and answer "
    "them.\n\n{text}", "Here is a passage:\n\n{text}\n\n{q} Quote the part of the passage that supports your answer.",
)
LANGUAGES = ("French", "Spanish", "German", "Italian", "Portuguese", "Dutch")
TRANSLATE = ("Translate into {lang}: {s}", "How would you say this in {lang}?\n\n{s}",
             "Translate this sentence into {lang} and explain one word choice:\n\n{s}",
             "Translate to {lang}, keeping the tone: {s}")
EVERYDAY = ("{name} will be late for the meeting in {city} because the train was delayed.",
            "Could you send me the {item} before Friday, please?",
            "The shop on the corner sells fresh {item} every morning.",
            "{name} moved to {city} last year and loves the food there.",
            "We need {n} more {item} for the party tonight.",
            "Thank you for your help, {name}; the trip to {city} was wonderful.",
            "Please remember to close the window when you leave the office.",
            "My flight to {city} leaves at {h}:30, so I will take a taxi.")
CODE_TASKS = (
    "reverses a string", "counts the vowels in a string", "checks whether a number is prime",
    "returns the n-th Fibonacci number", "flattens a nested list", "removes duplicates from a list while "
    "keeping order", "computes the average of a list of numbers", "finds the largest word in a sentence",
    "converts Celsius to Fahrenheit", "reads a text file and counts its lines", "sorts a list of "
    "dictionaries by a key", "returns the greatest common divisor of two numbers", "checks if two strings "
    "are anagrams", "capitalizes every word in a sentence", "computes the factorial of n iteratively",
    "groups words by their first letter", "finds the second smallest number in a list",
    "validates an email address with a simple check", "merges two dictionaries", "transposes a matrix",
    "counts how often each character appears in a text", "checks whether brackets in a string are balanced",
    "converts a date string from DD/MM/YYYY to YYYY-MM-DD", "returns the longest common prefix of a list of words",
    "splits a list into chunks of size n", "rotates a list by k positions", "finds all pairs in a list that sum to "
    "a target", "removes punctuation from a sentence", "converts a number to Roman numerals", "checks if a year is "
    "a leap year", "parses a query string into a dictionary", "returns the median of a list",
)
CODE = (
    "Write a Python function that {task}.", "Write a short Python program that {task}, with a docstring.",
    "How would you write a function in Python that {task}? Explain briefly.",
    "Write a JavaScript function that {task}.", "In Python, how do I write code that {task}?",
    "Write a Python function that {task}, and add two test cases.",
    "Give me a one-line Python expression or function that {task}.", "Write a Go function that {task}.",
    "Write a TypeScript function that {task}, with types.", "Write a Rust function that {task}.",
)
EXPLAIN_CODE = (
    "Explain what this Python function does:\n\n{code}", "What does this code do? Answer briefly.\n\n{code}",
    "Suggest one improvement to this Python function:\n\n{code}", "Write a docstring for this function:\n\n{code}",
    "Add type hints to this function and explain them:\n\n{code}",
    "What would be a good unit test for this function?\n\n{code}",
    "Rewrite this function to be easier to read:\n\n{code}",
)
NAMES = ("Alice", "Ben", "Chloe", "David", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Kenji", "Lena",
         "Mateo", "Nadia", "Omar", "Priya", "Quentin", "Rosa", "Sven", "Yuki")
CITIES = ("Lisbon", "Oslo", "Nairobi", "Toronto", "Osaka", "Lyon", "Dublin", "Austin", "Krakow", "Perth", "Porto",
          "Seoul", "Lima", "Cairo", "Vienna", "Hanoi")
ITEMS = ("books", "pencils", "oranges", "tickets", "cookies", "stamps", "marbles", "plants", "candles", "bottles")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
PRODUCTS = ("headphones", "coffee machine", "backpack", "phone case", "desk lamp", "running shoes", "kettle",
            "keyboard", "tent", "blender")
PRAISE = ("works well", "looks great", "arrived quickly", "is easy to use", "is very quiet", "feels sturdy")
COMPLAINTS = ("broke after a week", "is too heavy", "came without instructions", "is louder than expected",
              "was hard to set up", "costs too much for what it does")


def distillation_prompts(count: int, seed: int = 0, exclude: frozenset[str] = frozenset()) -> list[str]:
    """``count`` distinct prompts (fewer if the pool runs out): each kind shuffled with ``seed``, then taken in
    turn, so even a short run sees every kind. Benchmark prompts, and prompts too similar to one, are never
    among them; nor is anything in ``exclude``."""
    rng = random.Random(seed)
    queues = []
    for prompts in prompt_pool(seed).values():
        queue = [prompt for prompt in prompts if prompt not in exclude]
        rng.shuffle(queue)
        queues.append(queue)
    ordered = [queue[index] for index in range(max(map(len, queues))) for queue in queues if index < len(queue)]
    return ordered[:count]


@lru_cache(maxsize=4)
def prompt_pool(seed: int = 0, doc_root: Path = DEBIAN_DOC) -> Mapping[str, tuple[str, ...]]:
    """Every prompt by kind, made with ``seed`` (sorted, deduplicated across kinds, benchmark-like ones dropped)."""
    rng = random.Random(seed)
    passages = local_passages(doc_root)
    shares: dict[str, list[Passage]] = {kind: [] for kind in PASSAGE_KINDS}
    for passage in passages:  # each passage to a few kinds, so passages spread over kinds instead of repeating
        for kind in rng.sample(PASSAGE_KINDS, KINDS_PER_PASSAGE):
            shares[kind].append(passage)
    made = {kind: make(rng, shares.get(kind, passages)) for kind, make in KINDS.items()}
    held_out = benchmark_prompts()
    seen: set[str] = set()
    pool = {}
    for kind, prompts in made.items():
        kept = []
        for prompt in sorted(set(prompts)):
            key = " ".join(prompt.lower().split())
            if key not in seen and not too_similar(prompt, held_out):
                seen.add(key)
                kept.append(prompt)
        pool[kind] = tuple(kept)
    return MappingProxyType(pool)


# --- the kinds -------------------------------------------------------------------------------------------
def _topics(templates: tuple[str, ...]) -> Callable[[random.Random, Sequence[Passage]], list[str]]:
    return lambda rng, passages: [template.format(t=topic) for topic in TOPICS for template in templates]


def _comparisons(rng: random.Random, passages: Sequence[Passage]) -> list[str]:
    return [template.format(a=a, b=b, A=a[0].upper() + a[1:]) for a, b in PAIRS for template in COMPARISON]


def _howto(rng: random.Random, passages: Sequence[Passage]) -> list[str]:
    return [template.format(h=task) for task in HOWTO_TASKS for template in HOWTO]


def _email(rng: random.Random, passages: Sequence[Passage]) -> list[str]:
    return [rng.choice(EMAIL).format(r=recipient, p=purpose) for recipient in RECIPIENTS for purpose in PURPOSES
            for _ in range(2)]


def _on_passages(templates: tuple[str, ...]) -> Callable[[random.Random, Sequence[Passage]], list[str]]:
    return lambda rng, passages: [rng.choice(templates).format(text=p.text, q=rng.choice(QUESTIONS))
                                  for p in passages]


def _translation(rng: random.Random, passages: Sequence[Passage]) -> list[str]:
    sentences = [s for p in passages if 40 <= len(s := re.split(r"(?<=[.!?])\s", p.text)[0]) <= 160]
    sentences += [template.format(name=rng.choice(NAMES), city=rng.choice(CITIES), item=rng.choice(ITEMS),
                                  n=rng.randint(2, 30), h=rng.randint(6, 21))
                  for template in EVERYDAY for _ in range(40)]
    return [rng.choice(TRANSLATE).format(lang=rng.choice(LANGUAGES), s=sentence) for sentence in sentences]


def _extraction(rng: random.Random, passages: Sequence[Passage], count: int = 800) -> list[str]:
    prompts = _on_passages(EXTRACT)(rng, passages)
    for _ in range(count):
        first, second, third = rng.sample(NAMES, 3)
        city, item, month = rng.choice(CITIES), rng.choice(ITEMS), rng.choice(MONTHS)
        day, year = rng.randint(1, 28), rng.randint(2015, 2026)
        text = rng.choice((
            f"On {day} {month}, {first} met {second} in {city} and sold {rng.randint(2, 90)} {item} for "
            f"{rng.randint(5, 400)} euros.",
            f"{first} is {rng.randint(18, 80)}, {second} is {rng.randint(5, 60)} and their friend {third} turned "
            f"{rng.randint(20, 90)} in {month}.",
            f"The lease started on {day} {month} {year}, was extended on {rng.randint(1, 28)} "
            f"{rng.choice(MONTHS)} {year + 1} and ends on {rng.randint(1, 28)} {rng.choice(MONTHS)} {year + 3}.",
            f"Order {rng.randint(1000, 99999)}: {rng.randint(1, 9)} {item} shipped to {first} in {city}, total "
            f"{rng.randint(5, 300)}.{rng.randint(10, 99)} euros, delivery on {day} {month}.",
        ))
        prompts.append(rng.choice((
            f"Extract the names, the places and the numbers from this text:\n\n{text}",
            f"List every person mentioned in this text and what we learn about them:\n\n{text}",
            f"Turn this text into JSON with one field per fact:\n\n{text}",
            f"Extract the names of all people mentioned in this text, as a comma-separated list:\n\n{text}",
            f"List every date mentioned in this text: {text}",
            f"Extract the names and ages from: {text}",
        )))
    return prompts


def _classification(rng: random.Random, passages: Sequence[Passage], count: int = 500) -> list[str]:
    prompts = _on_passages(CLASSIFY)(rng, passages)
    for _ in range(count):
        product, good, bad = rng.choice(PRODUCTS), rng.choice(PRAISE), rng.choice(COMPLAINTS)
        review = rng.choice((f"The {product} {good}. Really happy with it.", f"The {product} {bad}. Disappointed.",
                             f"The {product} {good}, but it {bad.split(' ', 1)[1] if bad.startswith('is ') else bad}."))
        ticket = f"My {product} {bad} and I need it for work on {rng.choice(MONTHS)} {rng.randint(1, 28)}."
        prompts.append(rng.choice((
            f"Classify the sentiment of this review as positive, negative or mixed:\n\n{review}",
            f"Is this customer review positive or negative? Explain in one sentence.\n\n{review}",
            f"Label this support ticket with a category and a priority from 1 to 5:\n\n{ticket}",
            f"Which team should handle this message: sales, support or billing? Why?\n\n{ticket}",
        )))
    return prompts


def _code(rng: random.Random, passages: Sequence[Passage]) -> list[str]:
    return [template.format(task=task) for task in CODE_TASKS for template in CODE]


def _explain_code(rng: random.Random, passages: Sequence[Passage]) -> list[str]:
    return [rng.choice(EXPLAIN_CODE).format(code=code) for code in stdlib_functions()]


def _reasoning(rng: random.Random, passages: Sequence[Passage], count: int = 900) -> list[str]:
    prompts = []
    for _ in range(count):
        name, other, item = *rng.sample(NAMES, 2), rng.choice(ITEMS)
        a, b, c = rng.randint(3, 60), rng.randint(2, 12), rng.randint(2, 9)
        prompts.append(rng.choice((
            f"{name} has {a} {item}, buys {b} more and then gives away {c}. How many {item} are left? "
            "Explain step by step.",
            f"A box holds {b} {item}. How many boxes are needed for {a * c} {item}? Show your reasoning.",
            f"A train travels {a * 10} km in {b} hours. What is its average speed?",
            f"If {name} saves {b} dollars a week, how many weeks until {name} has {a * b} dollars?",
            f"What is {a} multiplied by {b}, minus {c}? Think it through.",
            f"A meeting starts at {b}:{c}0 and lasts {a} minutes. When does it end? Explain your steps.",
            f"{name} is older than {other}, who is older than {rng.choice(NAMES)}. Who is the youngest? Explain.",
            f"A shop sells {item} at {b} for {a} euros. How much do {b * c} {item} cost?",
            f"If {c} people share {a * c} {item} equally, how many does each get? Explain.",
            f"A bus leaves at {b + 6}:{c}5 and the ride takes {c} hours and {a % 50 + 5} minutes. When does it "
            "arrive? Show your steps.",
            f"A coat costs {a * 5} euros and is reduced by {c * 5} percent. What is the new price? Explain.",
            f"If today is {rng.choice(('Monday', 'Tuesday', 'Friday', 'Sunday'))}, what day will it be in "
            f"{a * 3} days?",
            f"What is the next number: {c}, {c + b}, {c + 2 * b}, {c + 3 * b}, ...? Explain the pattern.",
            f"{name} reads {b * 5} pages a day. A book has {a * 20} pages. How many days does {name} need?",
        )))
    return prompts


PASSAGE_KINDS = ("summary", "one_sentence", "rewrite", "extraction", "classification", "grounded_qa")
KINDS: dict[str, Callable[[random.Random, Sequence[Passage]], list[str]]] = {
    "chat": _topics(CHAT), "follow_up": _topics(FOLLOW_UP), "brainstorm": _topics(BRAINSTORM),
    "comparison": _comparisons, "howto": _howto, "email": _email,
    "summary": _on_passages(SUMMARY), "one_sentence": _on_passages(ONE_SENTENCE),
    "rewrite": _on_passages(REWRITE), "grounded_qa": _on_passages(GROUNDED),
    "translation": _translation, "extraction": _extraction, "classification": _classification,
    "code": _code, "explain_code": _explain_code, "reasoning": _reasoning,
}
