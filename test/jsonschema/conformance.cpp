/*
 * conformance.cpp
 *		Runs the official JSON-Schema-Test-Suite (Debian's
 *		libtest-json-schema-acceptance-perl ships it) against pg_tide's JSON
 *		Schema module, as test/t/077_payload_schema.pl does in CI.
 *
 * Usage: conformance <suite tests dir> <known failures file> [<cases file>]
 *
 * For draft7 and draft2020-12, every file of the draft's directory (not
 * optional/) and every case in it: the case's schema is compiled as the
 * module compiles it (the draft's default when "$schema" is absent), each
 * test's data validated and the outcome compared with the suite's. It
 * prints the counts per draft, then compares the cases that fail or are
 * skipped (a schema the module refuses) with the known failures file and
 * exits 1 when they differ, so that a regression (or a fix) is noticed.
 *
 * With a cases file, it also writes there, as CSV, every test of a schema
 * it compiled: the draft, where it is, the schema (as draft-07 says it when
 * the draft's default would be meant), the data and this runner's outcome.
 * test/t/077_payload_schema.pl loads them into a database and checks each
 * again as a publish checks a payload (jsonb read in place, through
 * tide._schema_validates()): the outcomes must be the same. A test whose
 * JSON holds \u0000, which jsonb cannot, is left out and counted.
 */
#include <algorithm>
#include <cstdio>
#include <dirent.h>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "schema.hpp"

/* The .json files of a directory, sorted. */
static std::vector<std::string>
suite_files(const std::string &dir)
{
	std::vector<std::string> files;
	DIR		   *d = opendir(dir.c_str());
	struct dirent *e;

	if (d == nullptr)
		return files;
	while ((e = readdir(d)) != nullptr)
	{
		std::string name = e->d_name;

		if (name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0)
			files.push_back(name);
	}
	closedir(d);
	std::sort(files.begin(), files.end());
	return files;
}

/* One CSV field: quoted, its quotes doubled. */
static std::string
csv_field(const std::string &s)
{
	std::string field = "\"";

	for (char c : s)
		field += c == '"' ? std::string("\"\"") : std::string(1, c);
	return field + "\"";
}

/* One line of the outcomes: no line breaks inside. */
static std::string
one_line(std::string s)
{
	std::replace(s.begin(), s.end(), '\n', ' ');
	return s;
}

/* Runs one draft's files; adds its failed and skipped lines to outcomes. */
static bool
run_draft(const std::string &suite, const std::string &draft, bool is_2020,
		  std::set<std::string> &outcomes, std::ofstream *cases_out)
{
	int			passed = 0,
				failed = 0,
				skipped = 0,
				written = 0,
				left_out = 0;
	std::vector<std::string> files = suite_files(suite + "/" + draft);

	if (files.empty())
	{
		fprintf(stderr, "no test files in %s/%s\n", suite.c_str(), draft.c_str());
		return false;
	}
	for (const std::string &file : files)
	{
		std::ifstream in(suite + "/" + draft + "/" + file);
		nlohmann::json cases = nlohmann::json::parse(in);

		for (const nlohmann::json &c : cases)
		{
			std::string where = draft + "/" + file + ": " + c["description"].get<std::string>();
			tide_jsonschema::SchemaPtr schema;
			std::string refused;

			try
			{
				schema = tide_jsonschema::compile(c["schema"], is_2020);
			}
			catch (const std::exception &e)
			{
				refused = e.what();
			}
			if (!schema)
			{
				skipped += (int) c["tests"].size();
				outcomes.insert(one_line("skip " + where + " (schema refused: " + refused + ")"));
				continue;
			}

			/* the module's default is 2020-12: a draft7 case says its draft */
			nlohmann::json stated = c["schema"];

			if (!is_2020 && stated.is_object() && !stated.contains("$schema"))
				stated["$schema"] = "http://json-schema.org/draft-07/schema#";
			for (const nlohmann::json &t : c["tests"])
			{
				tide_jsonschema::Failure failure;
				bool		valid;
				std::string error;

				try
				{
					valid = tide_jsonschema::validate(*schema, t["data"], &failure);
				}
				catch (const std::exception &e)
				{
					valid = !t["valid"].get<bool>();
					error = std::string(" (error: ") + e.what() + ")";
				}
				if (cases_out != nullptr && error.empty())
				{
					std::string schema_text = stated.dump();
					std::string data_text = t["data"].dump();

					if (schema_text.find("\\u0000") != std::string::npos ||
						data_text.find("\\u0000") != std::string::npos)
						left_out++;
					else
					{
						*cases_out << csv_field(draft) << "," <<
							csv_field(one_line(where + " / " + t["description"].get<std::string>())) <<
							"," << csv_field(schema_text) << "," << csv_field(data_text) << "," <<
							(valid ? "true" : "false") << "\n";
						written++;
					}
				}
				if (valid == t["valid"].get<bool>() && error.empty())
					passed++;
				else
				{
					failed++;
					outcomes.insert(one_line("fail " + where + " / " +
											 t["description"].get<std::string>() + error));
				}
			}
		}
	}
	printf("%s: %d passed, %d failed, %d skipped (schema refused) of %d\n",
		   draft.c_str(), passed, failed, skipped, passed + failed + skipped);
	if (cases_out != nullptr)
		printf("%s: %d tests written to the cases file, %d left out (\\u0000)\n",
			   draft.c_str(), written, left_out);
	return true;
}

int
main(int argc, char **argv)
{
	std::set<std::string> outcomes;
	std::set<std::string> known;
	std::string line;
	bool		same = true;

	std::ofstream cases_file;
	std::ofstream *cases_out = nullptr;

	if (argc != 3 && argc != 4)
	{
		fprintf(stderr, "usage: %s <suite tests dir> <known failures file> [<cases file>]\n", argv[0]);
		return 2;
	}
	if (argc == 4)
	{
		cases_file.open(argv[3]);
		if (!cases_file)
		{
			fprintf(stderr, "could not write %s\n", argv[3]);
			return 2;
		}
		cases_out = &cases_file;
	}
	if (!run_draft(argv[1], "draft7", false, outcomes, cases_out) ||
		!run_draft(argv[1], "draft2020-12", true, outcomes, cases_out))
		return 2;

	std::ifstream in(argv[2]);

	while (std::getline(in, line))
		if (!line.empty() && line[0] != '#')
			known.insert(line);
	for (const std::string &o : outcomes)
		if (!known.count(o))
		{
			printf("not in the known failures: %s\n", o.c_str());
			same = false;
		}
	for (const std::string &k : known)
		if (!outcomes.count(k))
		{
			printf("known failure that now passes: %s\n", k.c_str());
			same = false;
		}
	printf("%zu cases failed or skipped; %s\n", outcomes.size(),
		   same ? "as known" : "NOT as known");
	return same ? 0 : 1;
}
