"""A small English-like lexicon for synthetic text (demo tokenizer training and the simulator).

Plain common words, written for this project; the simulator strings them into sentences so that
generated text looks like prose, JSON and code without any real model behind it.
"""

WORDS = """
the of and to in is that for it as was with be by on not he this are or his from at which but
have an they you were her she there been one all we their has would when if so no will can more
other what up out about who them some could into than its then only over do also time new like
my two me after most first any these way our may well should because each just those people how
too little state good very make world still own see men work long get here between both life
being under never day same another know while last might us great old year off come since
against go came right used take three states himself few house use during without again place
around however home small found thought went say part once general high upon school every does
don't course war until always away something fact though water less public put think almost hand
enough far took head yet government system better set told nothing night end why called didn't
eyes find going look asked later knew point next city give group toward young let room side
social given present several order national possible rather second face per among form important
often things looked early white case john become large big need four within felt children along
saw best church ever least power development light thing seemed family interest want members mind
country area others done turned although open god service certain kind problem began different
door thus help sense means whole matter perhaps itself york times human law line above name
example action company hands local show whether five history gave today either act feet across
taken past quite anything seen having death experience body word half really week car field
answer question reason result value data model token tokens request response server client
function argument arguments tool tools call calls weather temperature forecast search query
number string boolean object array list file path user assistant system message content text
reasoning think step first then finally therefore because compute sum total price cost budget
run runs dataset datasets train training sample samples batch loss mask id ids length limit
error retry timeout provider route stream chunk delta usage key keys config option options
python code program input output return print import class def self true false none null
hello thanks please sure okay yes here let's check result looks correct answer is equal
""".split()

PUNCT = [".", ",", "?", "!", ":", ";"]

# A few Han characters and emoji so that multi-byte text and the Han split rule are exercised.
HAN = [chr(c) for c in range(0x4E00, 0x4E00 + 120, 3)]
EMOJI = ["\U0001F600", "\U0001F680", "\U0001F44D", "\u2728", "\U0001F389"]
