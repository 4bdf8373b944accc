#!/usr/bin/env python3
"""An mbox of N list posts for bench/list/archive-search.sh (seeded, so
every run gets the same one): threads of one to eight messages, replies
quoting their parent, words from a 5,000-word vocabulary of which the
first few are rare (quokka, wombat) and the rest Zipf-like."""
import random
import sys

n = int(sys.argv[1])
rnd = random.Random(40)
vocabulary = ['w%d' % i for i in range(5000)]
weights = [1.0 / (i + 10) for i in range(5000)]
out = sys.stdout
i = 0
day = 0
while i < n:
    root = i
    parent_text = None
    refs = []
    for depth in range(rnd.randint(1, 8)):
        if i >= n:
            break
        words = rnd.choices(vocabulary, weights, k=rnd.randint(60, 500))
        if rnd.random() < 0.01:
            words.insert(rnd.randrange(len(words)), 'quokka')
        if rnd.random() < 0.1:
            words.insert(rnd.randrange(len(words)), 'wombat')
        lines = [' '.join(words[k:k + 12]) for k in range(0, len(words), 12)]
        text = '\n'.join(lines) + '\n'
        if parent_text:
            text = 'Someone wrote:\n' + ''.join('> ' + l + '\n' for l in parent_text.splitlines()[:30]) + '\n' + text
        subject = ('Re: ' if refs else '') + 'topic %d %s' % (root, rnd.choice(vocabulary))
        day = i // 3000
        out.write('From poster%d@example.org Tue Dec  1 10:00:00 2026\n' % (i % 997))
        out.write('From: Poster %d <poster%d@example.org>\n' % (i % 997, i % 997))
        out.write('To: bench@lists.test\nSubject: %s\nMessage-Id: <m%d@example.org>\n' % (subject, i))
        if refs:
            out.write('In-Reply-To: <%s>\nReferences: %s\n' % (refs[-1], ' '.join('<%s>' % r for r in refs[-10:])))
        out.write('Date: %s, %02d %s 2026 %02d:%02d:00 +0000\n' % (
            'Mon', 1 + day % 28, ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov',
                                  'Dec'][(day // 28) % 12], i % 24, i % 60))
        out.write('MIME-Version: 1.0\nContent-Type: text/plain; charset=utf-8\n\n')
        out.write(text.replace('\nFrom ', '\n>From '))
        out.write('\n')
        refs.append('m%d@example.org' % i)
        parent_text = text
        i += 1
