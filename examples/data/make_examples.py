"""Writes the quickstart's example datasets (the .jsonl files next to this script are its output).

* `glaive_tools.jsonl`: glaive function-calling rows (system text with JSON function
  definitions, chat with USER/ASSISTANT/<functioncall>/FUNCTION RESPONSE): several functions, no
  functions, parallel and sequential calls, single-quoted and Python-literal arguments.
* `reasoning.jsonl`: Mixture-of-Thoughts style rows (assistant content `<think>...</think>` then
  the answer), single- and multi-turn.

Run `python examples/data/make_examples.py` to regenerate them.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent


def fn(name, description, props, required=()):
    return {"name": name, "description": description,
            "parameters": {"type": "object", "properties": props, "required": list(required)}}


S = {"type": "string"}
N = {"type": "number"}
INT = {"type": "integer"}

WEATHER = fn("get_weather", "Get the current weather of a city",
             {"city": {**S, "description": "City name"},
              "unit": {**S, "enum": ["celsius", "fahrenheit"], "description": "Temperature unit"}},
             ["city"])
CURRENCY = fn("convert_currency", "Convert an amount from one currency to another",
              {"amount": {**N, "description": "The amount to convert"},
               "from_currency": {**S, "description": "ISO code of the source currency"},
               "to_currency": {**S, "description": "ISO code of the target currency"}},
              ["amount", "from_currency", "to_currency"])
RESTAURANTS = fn("search_restaurants", "Find restaurants near a location",
                 {"location": S, "cuisine": {**S, "description": "Type of food"},
                  "max_price": {**INT, "description": "Price level from 1 to 4"}}, ["location"])
BMI = fn("calculate_bmi", "Calculate the body mass index",
         {"weight_kg": {**N, "description": "Weight in kilograms"},
          "height_m": {**N, "description": "Height in meters"}}, ["weight_kg", "height_m"])
STOCK = fn("get_stock_price", "Get the latest price of a stock",
           {"symbol": {**S, "description": "Ticker symbol, e.g. AAPL"}}, ["symbol"])
EMAIL = fn("send_email", "Send an email",
           {"to": {**S, "description": "Recipient address"}, "subject": S, "body": S},
           ["to", "subject", "body"])
EVENT = fn("create_calendar_event", "Create an event in the user's calendar",
           {"title": S, "date": {**S, "description": "YYYY-MM-DD"},
            "time": {**S, "description": "HH:MM, 24h"},
            "duration_minutes": {**INT, "description": "Length of the event"}},
           ["title", "date", "time"])
TRANSLATE = fn("translate_text", "Translate a text",
               {"text": S, "target_language": {**S, "description": "Language to translate into"}},
               ["text", "target_language"])
NEWS = fn("get_news_headlines", "Get the latest news headlines",
          {"country": S, "category": {**S, "enum": ["business", "sports", "technology", "science"]}},
          ["country"])
TIP = fn("calculate_tip", "Calculate the tip for a bill",
         {"bill_amount": N, "tip_percentage": N}, ["bill_amount", "tip_percentage"])
FLIGHTS = fn("find_flights", "Search flights between two airports on a date",
             {"origin": {**S, "description": "IATA code"}, "destination": {**S, "description": "IATA code"},
              "date": {**S, "description": "YYYY-MM-DD"}}, ["origin", "destination", "date"])
MOVIE = fn("get_movie_details", "Get details about a movie",
           {"title": S, "year": INT}, ["title"])
PASSWORD = fn("generate_password", "Generate a random password",
              {"length": {**INT, "description": "Number of characters"},
               "include_symbols": {"type": "boolean"}}, ["length"])
DISTANCE = fn("calculate_distance", "Distance between two places in kilometers",
              {"origin": S, "destination": S}, ["origin", "destination"])

WITH = ("SYSTEM: You are a helpful assistant with access to the following functions. "
        "Use them if required -\n")
WITHOUT = "SYSTEM: You are a helpful assistant, with no access to external functions."


def system(*fns):
    return WITH + "\n\n".join(json.dumps(f, indent=4) for f in fns)


def call(name, args, style="single"):
    """A glaive <functioncall> payload; style: single (quoted JSON), object, python."""
    if style == "single":
        a = "'" + json.dumps(args) + "'"
    elif style == "object":
        a = json.dumps(args)
    else:
        a = '"' + repr(args).replace('"', '\\"') + '"'
    return f'<functioncall> {{"name": "{name}", "arguments": {a}}}'


def chat(*turns):
    out = []
    for role, text in turns:
        if role == "U":
            out.append(f"USER: {text}")
        elif role == "A":
            out.append(f"ASSISTANT: {text} <|endoftext|>")
        else:
            out.append(f"FUNCTION RESPONSE: {json.dumps(text)}")
    return "\n\n\n".join(out) + "\n\n\n"


def glaive_rows():
    rows = []

    def add(fns, *turns):
        rows.append({"system": system(*fns) if fns else WITHOUT, "chat": chat(*turns)})

    add([WEATHER], ("U", "What's the weather like in Lisbon right now?"),
        ("A", call("get_weather", {"city": "Lisbon"})),
        ("F", {"city": "Lisbon", "temperature": 22, "unit": "celsius", "condition": "sunny"}),
        ("A", "It is sunny in Lisbon at the moment, with a temperature of 22 degrees Celsius."))
    add([CURRENCY, STOCK], ("U", "How much is 250 US dollars in euros?"),
        ("A", call("convert_currency", {"amount": 250, "from_currency": "USD", "to_currency": "EUR"})),
        ("F", {"converted_amount": 231.5, "currency": "EUR"}),
        ("A", "250 US dollars is about 231.50 euros at the current rate."))
    add([], ("U", "Can you explain what a black hole is in two sentences?"),
        ("A", "A black hole is a region of space where gravity is so strong that nothing, not even "
              "light, can escape once it crosses the event horizon. They form when very massive "
              "stars collapse at the end of their lives."))
    add([RESTAURANTS], ("U", "I'm in Kyoto and I'd love some cheap ramen tonight."),
        ("A", "Sure, let me look for affordable ramen places in Kyoto. "
              + call("search_restaurants", {"location": "Kyoto", "cuisine": "ramen", "max_price": 1})),
        ("F", {"results": [{"name": "Menya Inoichi", "rating": 4.6}, {"name": "Ramen Sen-no-Kaze", "rating": 4.5}]}),
        ("A", "Two well-rated budget options are Menya Inoichi (4.6) and Ramen Sen-no-Kaze (4.5). Enjoy your dinner!"))
    add([BMI], ("U", "I weigh 70 kg and I'm 1.75 m tall. What's my BMI?"),
        ("A", call("calculate_bmi", {"weight_kg": 70, "height_m": 1.75}, "object")),
        ("F", {"bmi": 22.86}),
        ("A", "Your BMI is about 22.9, which is in the normal weight range."))
    add([WEATHER, NEWS], ("U", "Tell me the weather in Oslo and the latest tech news in Norway."),
        ("A", call("get_weather", {"city": "Oslo"}) + " "
              + call("get_news_headlines", {"country": "Norway", "category": "technology"})),
        ("F", {"city": "Oslo", "temperature": -4, "unit": "celsius", "condition": "snow"}),
        ("F", {"headlines": ["Norwegian startup unveils electric ferry battery", "Oslo hosts Nordic AI summit"]}),
        ("A", "It is snowing in Oslo at -4 degrees Celsius. In Norwegian tech news: a startup unveiled a "
              "battery for electric ferries, and Oslo is hosting a Nordic AI summit."))
    add([EMAIL], ("U", "Please email my landlord at sam.lee@example.com that I'll pay the rent on Friday."),
        ("A", call("send_email", {"to": "sam.lee@example.com", "subject": "Rent payment",
                                  "body": "Hi Sam, I'll pay this month's rent on Friday. Thanks!"})),
        ("F", {"status": "sent"}),
        ("A", "Done. I've emailed Sam to let them know the rent will be paid on Friday."))
    add([], ("U", "Write a haiku about autumn leaves."),
        ("A", "Crimson leaves drifting,\nwhispering to the cold ground,\nsummer says goodbye."),
        ("U", "Now one about snow."),
        ("A", "Silent flakes falling,\nthe world wrapped in softest white,\nfootsteps disappear."))
    add([EVENT], ("U", "Schedule a dentist appointment for 2025-03-14 at 15:30 for 45 minutes."),
        ("A", call("create_calendar_event", {"title": "Dentist appointment", "date": "2025-03-14",
                                             "time": "15:30", "duration_minutes": 45})),
        ("F", {"status": "created", "event_id": "evt_1932"}),
        ("A", "Your dentist appointment is on the calendar for March 14, 2025 at 15:30, lasting 45 minutes."))
    add([TRANSLATE], ("U", "How do you say 'Where is the train station?' in German?"),
        ("A", call("translate_text", {"text": "Where is the train station?", "target_language": "German"})),
        ("F", {"translation": "Wo ist der Bahnhof?"}),
        ("A", "In German you would say: \"Wo ist der Bahnhof?\""))
    add([TIP], ("U", "My bill is $84 and I want to tip 18%. How much is that?"),
        ("A", call("calculate_tip", {"bill_amount": 84, "tip_percentage": 18}, "python")),
        ("F", {"tip_amount": 15.12}),
        ("A", "An 18% tip on $84 is $15.12, so the total comes to $99.12."))
    add([FLIGHTS], ("U", "I need a flight from Boston to Denver."),
        ("A", "I can help with that. Which date would you like to travel?"),
        ("U", "On the 2nd of May 2025."),
        ("A", call("find_flights", {"origin": "BOS", "destination": "DEN", "date": "2025-05-02"})),
        ("F", {"flights": [{"airline": "JetBlue", "departure": "07:05", "price": 189},
                           {"airline": "United", "departure": "13:40", "price": 214}]}),
        ("A", "On May 2 there is a JetBlue flight at 07:05 for $189 and a United flight at 13:40 for $214."))
    add([MOVIE], ("U", "What's the movie 'Spirited Away' about?"),
        ("A", call("get_movie_details", {"title": "Spirited Away"})),
        ("F", {"title": "Spirited Away", "year": 2001, "director": "Hayao Miyazaki",
               "plot": "A girl wanders into a world of spirits and must work in a bathhouse to free her parents."}),
        ("A", "Spirited Away (2001), directed by Hayao Miyazaki, follows a girl who wanders into a world of "
              "spirits and has to work in a bathhouse to free her parents, who were turned into pigs."))
    add([PASSWORD], ("U", "Generate a 16 character password with symbols, please."),
        ("A", call("generate_password", {"length": 16, "include_symbols": True}, "python")),
        ("F", {"password": "r7#Kq!2vZ@p9Lm&x"}),
        ("A", "Here is your new password: r7#Kq!2vZ@p9Lm&x. Store it somewhere safe."))
    add([STOCK], ("U", "Compare the stock prices of Apple and Microsoft."),
        ("A", call("get_stock_price", {"symbol": "AAPL"}) + "\n" + call("get_stock_price", {"symbol": "MSFT"})),
        ("F", {"symbol": "AAPL", "price": 189.3}),
        ("F", {"symbol": "MSFT", "price": 411.2}),
        ("A", "Apple (AAPL) trades at $189.30 and Microsoft (MSFT) at $411.20, so Microsoft's share price "
              "is a bit more than twice Apple's."))
    add([WEATHER, DISTANCE], ("U", "How far is Paris from Brussels, and is it raining in Brussels?"),
        ("A", call("calculate_distance", {"origin": "Paris", "destination": "Brussels"})),
        ("F", {"distance_km": 264}),
        ("A", call("get_weather", {"city": "Brussels"})),
        ("F", {"city": "Brussels", "temperature": 11, "unit": "celsius", "condition": "light rain"}),
        ("A", "Brussels is about 264 km from Paris, and yes, there is light rain there right now (11 degrees Celsius)."))
    add([WEATHER], ("U", "Can you recommend a good book about the history of Rome?"),
        ("A", "I can't look up books with the tools I have, but a popular choice is \"SPQR: A History of "
              "Ancient Rome\" by Mary Beard. It is readable and well researched."))
    add([], ("U", "What's the difference between a list and a tuple in Python?"),
        ("A", "A list is mutable: you can add, remove or change its items. A tuple is immutable: once "
              "created it cannot change, which makes it hashable and usable as a dictionary key."))
    add([EMAIL], ("U", "Send a note to ana@example.org saying I'm running 10 minutes late."),
        ("A", call("send_email", {"to": "ana@example.org", "subject": "Running late",
                                  "body": "Hi Ana, I'm running about 10 minutes late. Sorry!"})),
        ("F", {"status": "sent"}),
        ("A", "I've let Ana know you're running about 10 minutes late."))
    add([CURRENCY], ("U", "Convert 10,000 yen to British pounds."),
        ("A", call("convert_currency", {"amount": 10000, "from_currency": "JPY", "to_currency": "GBP"}, "object")),
        ("F", {"converted_amount": 52.7, "currency": "GBP"}),
        ("A", "10,000 Japanese yen is about 52.70 British pounds."),
        ("U", "And in US dollars?"),
        ("A", call("convert_currency", {"amount": 10000, "from_currency": "JPY", "to_currency": "USD"}, "object")),
        ("F", {"converted_amount": 66.9, "currency": "USD"}),
        ("A", "In US dollars that is about $66.90."))
    add([NEWS], ("U", "Any sports headlines from Brazil today?"),
        ("A", call("get_news_headlines", {"country": "Brazil", "category": "sports"})),
        ("F", {"headlines": ["Flamengo wins derby 2-1", "Brazil names squad for World Cup qualifiers"]}),
        ("A", "Today's Brazilian sports headlines: Flamengo won the derby 2-1, and the national team named "
              "its squad for the World Cup qualifiers."))
    add([], ("U", "Give me three tips for better sleep."),
        ("A", "1. Keep a regular schedule, even on weekends.\n2. Avoid screens and caffeine in the evening.\n"
              "3. Keep your bedroom cool, dark and quiet."))
    add([BMI, TIP], ("U", "What's 15% of a 60 euro dinner bill?"),
        ("A", call("calculate_tip", {"bill_amount": 60, "tip_percentage": 15})),
        ("F", {"tip_amount": 9.0}),
        ("A", "A 15% tip on a 60 euro bill is 9 euros."))
    add([TRANSLATE], ("U", "Translate \"I'm happy to meet you\" into French."),
        ("A", call("translate_text", {"text": "I'm happy to meet you", "target_language": "French"})),
        ("F", {"translation": "Je suis ravi de vous rencontrer"}),
        ("A", "In French: \"Je suis ravi de vous rencontrer.\""))
    add([EVENT, EMAIL], ("U", "Put 'Team sync' on 2025-06-02 at 09:00 and email bob@example.com about it."),
        ("A", call("create_calendar_event", {"title": "Team sync", "date": "2025-06-02", "time": "09:00"})
              + " " + call("send_email", {"to": "bob@example.com", "subject": "Team sync",
                                           "body": "Hi Bob, team sync on June 2 at 09:00."})),
        ("F", {"status": "created", "event_id": "evt_2201"}),
        ("F", {"status": "sent"}),
        ("A", "The team sync is scheduled for June 2 at 09:00, and Bob has been emailed about it."))
    add([], ("U", "Is a tomato a fruit or a vegetable?"),
        ("A", "Botanically a tomato is a fruit, because it develops from a flower and contains seeds. In "
              "cooking it is usually treated as a vegetable."))
    add([FLIGHTS, WEATHER], ("U", "Is it warm in Athens this week? I'm thinking of flying there from LHR on 2025-04-20."),
        ("A", call("get_weather", {"city": "Athens"})),
        ("F", {"city": "Athens", "temperature": 21, "unit": "celsius", "condition": "clear"}),
        ("A", "Athens is pleasant right now: clear skies and 21 degrees Celsius. Shall I look for flights from London Heathrow on April 20?"),
        ("U", "Yes please."),
        ("A", call("find_flights", {"origin": "LHR", "destination": "ATH", "date": "2025-04-20"})),
        ("F", {"flights": [{"airline": "Aegean", "departure": "08:15", "price": 142}]}),
        ("A", "There is an Aegean flight from Heathrow to Athens on April 20 at 08:15 for 142 pounds."))
    add([MOVIE], ("U", "Who directed Inception and when did it come out?"),
        ("A", call("get_movie_details", {"title": "Inception"}, "python")),
        ("F", {"title": "Inception", "year": 2010, "director": "Christopher Nolan"}),
        ("A", "Inception was directed by Christopher Nolan and released in 2010."))
    add([PASSWORD, EMAIL], ("U", "What can you help me with?"),
        ("A", "I can generate secure passwords and send emails for you. Just tell me what you need."))
    add([WEATHER], ("U", "Weather in Cape Town in fahrenheit?"),
        ("A", call("get_weather", {"city": "Cape Town", "unit": "fahrenheit"})),
        ("F", {"city": "Cape Town", "temperature": 77, "unit": "fahrenheit", "condition": "windy"}),
        ("A", "It's windy in Cape Town at 77 degrees Fahrenheit."))
    add([DISTANCE], ("U", "How far is it from Madrid to Barcelona?"),
        ("A", "Let me calculate that. " + call("calculate_distance", {"origin": "Madrid", "destination": "Barcelona"})),
        ("F", {"distance_km": 505}),
        ("A", "Madrid and Barcelona are about 505 km apart; the high-speed train takes roughly two and a half hours."))
    return rows


def think(reasoning, answer):
    return f"<think>\n{reasoning}\n</think>\n\n{answer}"


def reasoning_rows():
    items = [
        ("math", "What is 17 * 23?",
         "17 * 23 = 17 * 20 + 17 * 3 = 340 + 51 = 391.", "17 × 23 = **391**."),
        ("math", "Solve for x: 3x + 7 = 22.",
         "Subtract 7 from both sides: 3x = 15. Divide by 3: x = 5. Check: 3*5 + 7 = 22. Correct.",
         "x = 5"),
        ("math", "What is the sum of the interior angles of a hexagon?",
         "For an n-gon the sum is (n - 2) * 180 degrees. A hexagon has n = 6, so (6 - 2) * 180 = 720.",
         "The interior angles of a hexagon add up to 720°."),
        ("math", "Is 221 a prime number?",
         "Check small primes up to sqrt(221) ~ 14.9: 2 no, 3: 2+2+1 = 5 no, 5 no, 7: 7*31 = 217, remainder 4, no. "
         "11: 11*20 = 220, remainder 1, no. 13: 13*17 = 221. So 221 = 13 * 17.",
         "No. 221 = 13 × 17, so it is not prime."),
        ("math", "A train travels 180 km in 2.5 hours. What is its average speed?",
         "Average speed = distance / time = 180 / 2.5 = 72 km/h.", "Its average speed is 72 km/h."),
        ("math", "What is the derivative of x^3 * sin(x)?",
         "Product rule: (uv)' = u'v + uv'. u = x^3, u' = 3x^2; v = sin x, v' = cos x. "
         "So the derivative is 3x^2 sin x + x^3 cos x.",
         "d/dx [x³ sin x] = 3x² sin x + x³ cos x."),
        ("math", "How many ways can 5 people sit in a row?",
         "The number of arrangements of 5 distinct people is 5! = 5*4*3*2*1 = 120.", "There are 120 ways."),
        ("math", "What is 15% of 240?",
         "15% = 0.15. 0.15 * 240 = 36. Alternatively 10% is 24 and 5% is 12, total 36.", "15% of 240 is 36."),
        ("math", "If a rectangle has a perimeter of 30 and a length of 9, what is its area?",
         "Perimeter = 2(l + w) = 30, so l + w = 15 and w = 15 - 9 = 6. Area = 9 * 6 = 54.",
         "The width is 6, so the area is 54."),
        ("math", "What is the greatest common divisor of 84 and 126?",
         "Euclid: 126 = 1*84 + 42; 84 = 2*42 + 0. So gcd = 42.", "gcd(84, 126) = 42."),
        ("code", "Write a Python function that reverses a string.",
         "The simplest way is slicing with a step of -1: s[::-1]. Wrap it in a function with a type hint.",
         "```python\ndef reverse(s: str) -> str:\n    return s[::-1]\n```"),
        ("code", "What does `git rebase -i HEAD~3` do?",
         "Interactive rebase over the last three commits: git opens an editor listing them, and you can "
         "pick, reword, squash, fixup, drop or reorder them before they are replayed.",
         "It starts an interactive rebase of the last three commits, letting you reorder, edit, squash "
         "or drop them before git replays them."),
        ("code", "Why is `0.1 + 0.2 != 0.3` in most programming languages?",
         "Floats are binary fractions (IEEE 754). 0.1 and 0.2 have no exact binary representation, so "
         "they are rounded; their sum rounds to 0.30000000000000004, which differs from the double nearest 0.3.",
         "Because 0.1 and 0.2 cannot be represented exactly in binary floating point; the rounded sum is "
         "0.30000000000000004, not the double closest to 0.3. Compare with a tolerance instead."),
        ("code", "Write a SQL query that counts orders per customer.",
         "Group the orders table by customer_id and count rows; order by the count for readability.",
         "```sql\nSELECT customer_id, COUNT(*) AS orders\nFROM orders\nGROUP BY customer_id\nORDER BY orders DESC;\n```"),
        ("code", "What is the time complexity of binary search?",
         "Each step halves the search interval, so after k steps n / 2^k elements remain; it ends when "
         "that reaches 1, i.e. k = log2 n.", "O(log n): each comparison halves the remaining range."),
        ("code", "How do I read a file line by line in Python without loading it all?",
         "Iterating over a file object yields lines lazily, using a buffer. Use a with block so the "
         "file is closed.", "```python\nwith open(path, encoding=\"utf-8\") as f:\n    for line in f:\n        handle(line)\n```"),
        ("science", "Why is the sky blue?",
         "Sunlight scatters off air molecules. Rayleigh scattering goes as 1/wavelength^4, so blue light "
         "(short wavelength) scatters much more than red and reaches our eyes from all directions.",
         "Air molecules scatter short (blue) wavelengths far more than long ones (Rayleigh scattering), "
         "so scattered blue light comes at us from every part of the sky."),
        ("science", "What is the boiling point of water at the top of Mount Everest?",
         "Air pressure at 8,849 m is about a third of sea level (~34 kPa). Water boils when its vapour "
         "pressure equals the ambient pressure; at ~34 kPa that is about 70 °C.",
         "About 70 °C, because the air pressure there is only about a third of that at sea level."),
        ("science", "How many moles are in 36 grams of water?",
         "Molar mass of H2O = 2*1 + 16 = 18 g/mol. 36 / 18 = 2 moles.", "36 g of water is 2 moles."),
        ("science", "Why do we have seasons?",
         "Not distance: Earth's orbit is nearly circular. The axis is tilted by about 23.4 degrees, so "
         "each hemisphere gets more direct sunlight and longer days during part of the year.",
         "Because Earth's axis is tilted about 23.4°: each hemisphere gets more direct sunlight and longer "
         "days for half of the orbit (summer) and less for the other half (winter)."),
        ("science", "What is the difference between mass and weight?",
         "Mass is the amount of matter, in kg, the same everywhere. Weight is the gravitational force "
         "on that mass, W = m g, in newtons, which changes with g.",
         "Mass is how much matter an object has (kg) and never changes; weight is the force gravity "
         "exerts on it (N), so it differs on the Moon."),
        ("logic", "If all bloops are razzies and all razzies are lazzies, are all bloops lazzies?",
         "Transitivity of set inclusion: bloops ⊆ razzies ⊆ lazzies, so bloops ⊆ lazzies.",
         "Yes. Every bloop is a razzie, and every razzie is a lazzie, so every bloop is a lazzie."),
        ("logic", "A bat and a ball cost $1.10. The bat costs $1.00 more than the ball. How much is the ball?",
         "Let the ball be b. Bat = b + 1.00. b + b + 1.00 = 1.10, so 2b = 0.10 and b = 0.05. "
         "The intuitive answer 0.10 would make the total 1.20.", "The ball costs 5 cents."),
        ("logic", "What comes next: 2, 6, 12, 20, 30, ?",
         "Differences: 4, 6, 8, 10, so the next difference is 12: 30 + 12 = 42. Also n(n+1): 1*2, 2*3, ..., 6*7 = 42.",
         "42 (the terms are n × (n + 1))."),
        ("logic", "I have two coins that total 30 cents and one of them is not a nickel. What are they?",
         "Coins: 25 + 5 = 30. One of them is not a nickel: the quarter. The other one is a nickel.",
         "A quarter and a nickel: the quarter is the one that is not a nickel."),
        ("math", "Convert 0.375 to a fraction.",
         "0.375 = 375/1000. gcd(375, 1000) = 125. 375/125 = 3, 1000/125 = 8.", "0.375 = 3/8."),
    ]
    rows = []
    for source, q, r, a in items:
        rows.append({"messages": [{"role": "user", "content": q},
                                  {"role": "assistant", "content": think(r, a)}],
                     "num_tokens": len(r.split()) + len(a.split()), "source": source})
    # multi-turn rows, for turns = "all"
    rows.append({"messages": [
        {"role": "user", "content": "What is 2^10?"},
        {"role": "assistant", "content": think("2^10 = 1024 (2^5 = 32, 32^2 = 1024).", "2¹⁰ = 1024.")},
        {"role": "user", "content": "And 2^20?"},
        {"role": "assistant", "content": think("2^20 = (2^10)^2 = 1024^2 = 1,048,576.", "2²⁰ = 1,048,576.")},
    ], "num_tokens": 40, "source": "math"})
    rows.append({"messages": [
        {"role": "system", "content": "You are a patient tutor. Explain briefly."},
        {"role": "user", "content": "What is a prime number?"},
        {"role": "assistant", "content": think(
            "Definition: an integer greater than 1 whose only positive divisors are 1 and itself.",
            "A prime is a whole number greater than 1 that is divisible only by 1 and itself, like 2, 3, 5 or 7.")},
        {"role": "user", "content": "Is 1 prime?"},
        {"role": "assistant", "content": think(
            "By the definition 1 is excluded; it has only one divisor. Keeping it out keeps prime "
            "factorisation unique.", "No. 1 is not prime: primes must be greater than 1, which keeps "
            "every number's prime factorisation unique.")},
    ], "num_tokens": 80, "source": "math"})
    return rows


def write(name, rows):
    with open(HERE / name, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    write("glaive_tools.jsonl", glaive_rows())
    write("reasoning.jsonl", reasoning_rows())
