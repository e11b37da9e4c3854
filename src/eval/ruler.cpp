#include "eval/ruler.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "core/error.h"
#include "core/file_io.h"
#include "eval/niah.h"

namespace hlm {

namespace {

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

using Tokens = std::vector<int32_t>;

// Assembles prefix + filler-with-inserts + suffix at exactly `length` tokens: the filler (haystack tokens)
// absorbs whatever the fixed parts leave, and the inserts go at their relative positions in it.
Tokens assemble(i64 length, const Tokens& prefix, std::vector<Tokens> inserts, std::vector<double> where,
                const Tokens& suffix, const Haystack& hay, Rng& rng, const std::string& task) {
  i64 fixed = static_cast<i64>(prefix.size() + suffix.size());
  for (auto& t : inserts) fixed += static_cast<i64>(t.size());
  const i64 budget = length - fixed;
  if (budget < 0)
    throw RulerTooShort(fmt::format("ruler {}: length {} is too short for this task ({} tokens needed without haystack)",
                                    task, length, fixed));
  Tokens filler = hay.take(budget, rng);
  std::vector<size_t> order(inserts.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return where[a] < where[b]; });
  Tokens out = prefix;
  i64 pos = 0;
  for (size_t i : order) {
    const i64 at = std::clamp<i64>(static_cast<i64>(std::floor(where[i] * static_cast<double>(budget))), pos, budget);
    out.insert(out.end(), filler.begin() + pos, filler.begin() + at);
    out.insert(out.end(), inserts[i].begin(), inserts[i].end());
    pos = at;
  }
  out.insert(out.end(), filler.begin() + pos, filler.end());
  out.insert(out.end(), suffix.begin(), suffix.end());
  return out;
}

i64 gen_budget(const data::Tokenizer& tok, const std::vector<std::string>& refs) {
  i64 n = 8;
  for (auto& r : refs) n += static_cast<i64>(tok.encode(" " + r + ",").size());
  return n;
}

std::string join_keys(const std::vector<std::string>& k) {
  if (k.size() == 1) return k[0];
  std::string s;
  for (size_t i = 0; i + 1 < k.size(); ++i) s += k[i] + ", ";
  return s + "and " + k.back();
}

RulerSample niah_task(const std::string& task, i64 length, const data::Tokenizer& tok, const Haystack& hay, int n_keys,
                      int n_values, int n_queries, bool needle_haystack, Rng& rng) {
  RulerSample s;
  s.task = task;
  std::vector<std::string> keys;
  std::set<std::string> used;
  while (static_cast<int>(keys.size()) < n_keys) {
    std::string k = random_key(rng);
    if (used.insert(k).second) keys.push_back(k);
  }
  std::vector<std::vector<std::string>> values(keys.size());
  std::vector<Tokens> inserts;
  std::vector<double> where;
  for (size_t i = 0; i < keys.size(); ++i)
    for (int v = 0; v < (i == 0 ? n_values : 1); ++v) {
      values[i].push_back(random_number(rng));
      inserts.push_back(tok.encode("\nOne of the special magic numbers for " + keys[i] + " is: " + values[i].back() + ".\n"));
      where.push_back(rng.uniform());
    }
  std::vector<std::string> qkeys(keys.begin(), keys.begin() + n_queries);
  const bool plural = n_values * n_queries > 1;
  Tokens prefix = tok.encode(std::string(plural ? "Some special magic numbers are" : "A special magic number is") +
                             " hidden within the following text. Make sure to memorize it. I will quiz you about the "
                             "numbers afterwards.\n");
  Tokens suffix = tok.encode("\nWhat " + std::string(plural ? "are all the special magic numbers" : "is the special magic number") +
                             " for " + join_keys(qkeys) + " mentioned in the provided text? The special magic " +
                             (plural ? "numbers" : "number") + " for " + join_keys(qkeys) + " mentioned in the provided text " +
                             (plural ? "are" : "is"));
  if (needle_haystack) {
    // Every haystack line is a distractor needle (RULER niah_multikey_2): add them until ~length.
    i64 used_tokens = 0;
    for (auto& t : inserts) used_tokens += static_cast<i64>(t.size());
    while (true) {
      std::string k = random_key(rng);
      if (used.count(k)) continue;
      Tokens t = tok.encode("\nOne of the special magic numbers for " + k + " is: " + random_number(rng) + ".\n");
      if (used_tokens + static_cast<i64>(t.size()) > length - static_cast<i64>(prefix.size() + suffix.size())) break;
      used.insert(k);
      used_tokens += static_cast<i64>(t.size());
      inserts.push_back(t);
      where.push_back(rng.uniform());
    }
  }
  s.prompt = assemble(length, prefix, inserts, where, suffix, hay, rng, task);
  for (int q = 0; q < n_queries; ++q)
    for (auto& v : values[q]) s.references.push_back(v);
  s.max_new_tokens = gen_budget(tok, s.references);
  return s;
}

RulerSample vt_task(i64 length, const data::Tokenizer& tok, const Haystack& noise, Rng& rng) {
  RulerSample s;
  s.task = "vt";
  const std::string value = random_number(rng, 5);
  std::vector<std::string> names;
  std::set<std::string> used;
  while (names.size() < 5) {
    std::string n;
    for (int i = 0; i < 5; ++i) n += static_cast<char>('A' + rng.below(26));
    if (used.insert(n).second) names.push_back(n);
  }
  std::vector<Tokens> inserts;
  std::vector<double> where;
  std::vector<double> w;
  for (int i = 0; i < 5; ++i) w.push_back(rng.uniform());
  std::sort(w.begin(), w.end());  // statements appear in chain order
  inserts.push_back(tok.encode("\nVAR " + names[0] + " = " + value + ".\n"));
  where.push_back(w[0]);
  for (int i = 1; i < 5; ++i) {
    inserts.push_back(tok.encode("\nVAR " + names[i] + " = VAR " + names[i - 1] + ".\n"));
    where.push_back(w[i]);
  }
  Tokens prefix = tok.encode("Memorize and track the chain(s) of variable assignment hidden in the following text.\n");
  Tokens suffix = tok.encode("\nQuestion: Find all variables that are assigned the value " + value +
                             " in the text above. Answer: According to the chain(s) of variable assignment in the text "
                             "above, 5 variables are assigned the value " + value + ", they are:");
  s.prompt = assemble(length, prefix, inserts, where, suffix, noise, rng, "vt");
  s.references = names;
  s.max_new_tokens = gen_budget(tok, s.references);
  return s;
}

// Common words (cwe: 10 words many times, others few times) and frequent words (fwe: Zipf counts).
RulerSample words_task(const std::string& task, i64 length, const data::Tokenizer& tok, const Haystack& noise, Rng& rng) {
  RulerSample s;
  s.task = task;
  Tokens prefix = tok.encode(task == "cwe" ? "Below is a numbered list of words. In these words, some appear more often "
                                             "than others. Memorize the ones that appear most often.\n"
                                           : "Read the following coded text and track the frequency of each coded word. "
                                             "Find the three most frequently appeared coded words.\n");
  Tokens suffix = tok.encode(task == "cwe" ? "\nQuestion: What are the 10 most common words in the above list? Answer: "
                                             "The top 10 words that appear most often in the list are:"
                                           : "\nQuestion: Do not provide any explanation. Please ignore the dots '....'. "
                                             "What are the three most frequently appeared words in the above coded text? "
                                             "Answer: According to the coded text above, the three most frequently "
                                             "appeared words are:");
  const i64 budget = length - static_cast<i64>(prefix.size() + suffix.size());
  if (budget < 32) throw RulerTooShort(fmt::format("ruler {}: length {} is too short", task, length));
  // Estimate tokens per word item from a sample, then size the vocabulary so the list fills the budget.
  std::vector<std::string> words;
  std::vector<int> counts;
  const i64 per_word = std::max<i64>(1, static_cast<i64>(tok.encode(" 12. abcdef").size()));
  const i64 n_items = std::max<i64>(20, budget / per_word);
  if (task == "cwe") {
    const int common = 10, freq_c = n_items >= 400 ? 30 : 6, freq_u = n_items >= 400 ? 3 : 1;
    const i64 n_uncommon = std::max<i64>(1, (n_items - common * freq_c) / freq_u);
    std::set<std::string> used;
    while (static_cast<i64>(words.size()) < common + n_uncommon) {
      std::string w = random_word(rng, 6);
      if (used.insert(w).second) words.push_back(w);
    }
    for (size_t i = 0; i < words.size(); ++i) counts.push_back(i < 10 ? freq_c : freq_u);
    s.references.assign(words.begin(), words.begin() + 10);
  } else {
    // Rank k appears ~ n * k^-2 / zeta(2) times; rank 1 is the noise word "...." (ignored by the question).
    const double zeta2 = M_PI * M_PI / 6.0;
    std::set<std::string> used;
    for (int k = 1; k <= 64; ++k) {
      int c = static_cast<int>(std::floor(static_cast<double>(n_items) / (k * static_cast<double>(k)) / zeta2));
      if (c < 1) break;
      std::string w = k == 1 ? "...." : random_word(rng, 6);
      if (k > 1 && !used.insert(w).second) continue;
      words.push_back(w);
      counts.push_back(c);
    }
    for (size_t i = 1; i < words.size() && s.references.size() < 3; ++i) s.references.push_back(words[i]);
  }
  std::vector<std::string> items;
  for (size_t i = 0; i < words.size(); ++i)
    for (int c = 0; c < counts[i]; ++c) items.push_back(words[i]);
  for (size_t i = items.size(); i > 1; --i) std::swap(items[i - 1], items[rng.below(i)]);
  Tokens body;
  for (size_t i = 0; i < items.size(); ++i) {
    Tokens t = tok.encode(task == "cwe" ? fmt::format(" {}. {}", i + 1, items[i]) : " " + items[i]);
    if (static_cast<i64>(body.size() + t.size()) > budget) break;
    body.insert(body.end(), t.begin(), t.end());
  }
  // Exact length: the remaining budget is noise placed before the list.
  Tokens pad = noise.take(budget - static_cast<i64>(body.size()), rng);
  s.prompt = prefix;
  s.prompt.insert(s.prompt.end(), pad.begin(), pad.end());
  s.prompt.insert(s.prompt.end(), body.begin(), body.end());
  s.prompt.insert(s.prompt.end(), suffix.begin(), suffix.end());
  s.max_new_tokens = gen_budget(tok, s.references);
  return s;
}

RulerSample qa_task(i64 length, const data::Tokenizer& tok, const std::vector<QaItem>& qa, Rng& rng) {
  if (qa.empty()) fail("ruler qa: the QA file has no items");
  const QaItem& item = qa[rng.below(qa.size())];
  RulerSample s;
  s.task = "qa";
  s.metric = "part";
  s.references = item.answers;
  Tokens prefix = tok.encode("Answer the question based on the given documents. Only give me the answer and do not "
                             "output any other words.\n\nThe following are given documents.\n\n");
  Tokens suffix = tok.encode("\n\nAnswer the question based on the given documents. Only give me the answer and do not "
                             "output any other words.\n\nQuestion: " + item.question + " Answer:");
  i64 budget = length - static_cast<i64>(prefix.size() + suffix.size());
  std::vector<std::string> docs = item.documents;
  // Distractors: documents of other items, in seeded order, until the budget is used.
  std::vector<Tokens> enc;
  i64 used = 0;
  for (auto& d : docs) {
    enc.push_back(tok.encode(d));
    used += static_cast<i64>(enc.back().size()) + 8;
  }
  if (used > budget)
    throw RulerTooShort(fmt::format("ruler qa: length {} is too short for the gold documents ({} tokens)", length, used));
  for (int tries = 0; tries < 4 * static_cast<int>(qa.size()) && used < budget; ++tries) {
    const QaItem& other = qa[rng.below(qa.size())];
    if (&other == &item || other.documents.empty()) continue;
    Tokens t = tok.encode(other.documents[rng.below(other.documents.size())]);
    if (used + static_cast<i64>(t.size()) + 8 > budget) break;
    used += static_cast<i64>(t.size()) + 8;
    enc.push_back(t);
  }
  for (size_t i = enc.size(); i > 1; --i) std::swap(enc[i - 1], enc[rng.below(i)]);
  Tokens body;
  for (size_t i = 0; i < enc.size(); ++i) {
    Tokens h = tok.encode(fmt::format("Document {}:\n", i + 1));
    body.insert(body.end(), h.begin(), h.end());
    body.insert(body.end(), enc[i].begin(), enc[i].end());
    Tokens nl = tok.encode("\n\n");
    body.insert(body.end(), nl.begin(), nl.end());
  }
  if (static_cast<i64>(body.size()) > budget) body.resize(static_cast<size_t>(budget));
  Tokens pad(static_cast<size_t>(budget - static_cast<i64>(body.size())), tok.encode(" ").empty() ? 0 : tok.encode(" ")[0]);
  s.prompt = prefix;
  s.prompt.insert(s.prompt.end(), body.begin(), body.end());
  s.prompt.insert(s.prompt.end(), pad.begin(), pad.end());
  s.prompt.insert(s.prompt.end(), suffix.begin(), suffix.end());
  s.max_new_tokens = gen_budget(tok, s.references);
  return s;
}

}  // namespace

std::vector<std::string> ruler_task_names() {
  return {"niah_single_1", "niah_single_2", "niah_multikey_1", "niah_multikey_2", "niah_multivalue",
          "niah_multiquery", "vt", "cwe", "fwe"};
}

RulerSample make_ruler_sample(const std::string& task, i64 length, const data::Tokenizer& tok, const Haystack& noise,
                              const Haystack* corpus, const std::vector<QaItem>* qa, Rng& rng) {
  const Haystack& essay = corpus ? *corpus : noise;
  if (task == "niah_single_1") return niah_task(task, length, tok, noise, 1, 1, 1, false, rng);
  if (task == "niah_single_2") return niah_task(task, length, tok, essay, 1, 1, 1, false, rng);
  if (task == "niah_multikey_1") return niah_task(task, length, tok, essay, 4, 1, 1, false, rng);
  if (task == "niah_multikey_2") return niah_task(task, length, tok, noise, 1, 1, 1, true, rng);
  if (task == "niah_multivalue") return niah_task(task, length, tok, essay, 1, 4, 1, false, rng);
  if (task == "niah_multiquery") return niah_task(task, length, tok, essay, 4, 1, 4, false, rng);
  if (task == "vt") return vt_task(length, tok, noise, rng);
  if (task == "cwe" || task == "fwe") return words_task(task, length, tok, noise, rng);
  if (task == "qa") {
    if (!qa) fail("ruler: task 'qa' needs --qa-file (JSONL with question, answers, documents)");
    return qa_task(length, tok, *qa, rng);
  }
  std::string known;
  for (auto& t : ruler_task_names()) known += t + ", ";
  fail("ruler: unknown task '{}' (known: {}qa)", task, known);
}

double string_match_all(const std::string& pred, const std::vector<std::string>& refs) {
  if (refs.empty()) return 0;
  const std::string p = lower(pred);
  double hit = 0;
  for (auto& r : refs) hit += p.find(lower(r)) != std::string::npos;
  return 100.0 * hit / static_cast<double>(refs.size());
}

double string_match_part(const std::string& pred, const std::vector<std::string>& refs) {
  const std::string p = lower(pred);
  for (auto& r : refs)
    if (p.find(lower(r)) != std::string::npos) return 100.0;
  return 0.0;
}

std::vector<QaItem> load_qa_file(const std::string& path) {
  std::istringstream f(read_text_file(path, "QA file", std::size_t{1} << 30));
  std::vector<QaItem> out;
  std::string line;
  int ln = 0;
  while (std::getline(f, line)) {
    ++ln;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {  // also out_of_range: a number too large
      fail("{}:{}: malformed JSON: {}", path, ln, e.what());
    }
    QaItem q;
    if (!j.contains("question") || !j["question"].is_string()) fail("{}:{}: field 'question' must be a string", path, ln);
    if (!j.contains("answers") || !j["answers"].is_array() || j["answers"].empty())
      fail("{}:{}: field 'answers' must be a non-empty list of strings", path, ln);
    if (!j.contains("documents") || !j["documents"].is_array())
      fail("{}:{}: field 'documents' must be a list of strings", path, ln);
    q.question = j["question"];
    for (auto& a : j["answers"]) q.answers.push_back(a.get<std::string>());
    for (auto& d : j["documents"]) q.documents.push_back(d.get<std::string>());
    out.push_back(std::move(q));
  }
  if (out.empty()) fail("{}: no QA items", path);
  return out;
}

nlohmann::json run_ruler(Model& model, const data::Tokenizer& tok, const Haystack& noise, const Haystack* corpus,
                         const std::vector<QaItem>* qa, const RulerConfig& c) {
  nlohmann::json tasks = nlohmann::json::object(), examples = nlohmann::json::array(), skipped = nlohmann::json::array();
  std::vector<double> avg(c.lengths.size(), 0.0);
  std::vector<int> fitted(c.lengths.size(), 0);  // tasks scored at each length
  const size_t total = c.tasks.size() * c.lengths.size() * static_cast<size_t>(c.samples);
  size_t done = 0;
  for (const auto& task : c.tasks) {
    nlohmann::json per_len = nlohmann::json::array();
    for (size_t li = 0; li < c.lengths.size(); ++li) {
      Rng rng(c.seed + 1000003ULL * li + std::hash<std::string>{}(task));
      double sum = 0;
      bool fits = true;
      for (int s = 0; s < c.samples && fits; ++s) {
        RulerSample smp;
        try {
          smp = make_ruler_sample(task, c.lengths[li], tok, noise, corpus, qa, rng);
        } catch (const RulerTooShort& e) {
          if (!c.skip_too_short) throw;
          skipped.push_back({{"task", task}, {"length", c.lengths[li]}, {"reason", e.what()}});
          done += static_cast<size_t>(c.samples - s);
          fits = false;
          break;
        }
        std::string pred = complete(model, tok, smp.prompt, smp.max_new_tokens);
        double score = smp.metric == "part" ? string_match_part(pred, smp.references) : string_match_all(pred, smp.references);
        sum += score;
        if (s == 0) examples.push_back({{"task", task}, {"length", c.lengths[li]}, {"references", smp.references},
                                        {"prediction", pred}, {"score", score}});
        ++done;
        if (c.progress)
          fmt::print(stderr, "\r\033[Kruler: {}/{} | {} @ {} | score {:.1f}", done, total, task, c.lengths[li], score);
      }
      if (!fits) {
        per_len.push_back(nullptr);
        continue;
      }
      per_len.push_back(sum / c.samples);
      avg[li] += sum / c.samples;
      ++fitted[li];
    }
    tasks[task] = per_len;
  }
  if (c.progress) fmt::print(stderr, "\n");
  nlohmann::json average = nlohmann::json::array();
  for (size_t li = 0; li < c.lengths.size(); ++li)
    average.push_back(fitted[li] ? nlohmann::json(avg[li] / fitted[li]) : nlohmann::json(nullptr));
  nlohmann::json out = {{"lengths", c.lengths}, {"tasks", tasks}, {"average", average}, {"samples", c.samples},
                        {"examples", examples}};
  if (c.skip_too_short) out["skipped"] = skipped;
  return out;
}

}  // namespace hlm
