/*
 * jsonb_adapter.hpp
 *		A valijson adapter over a jsonb value read in place (jsonb_reader.h),
 *		so that a payload is checked with no text printed and no document
 *		parsed: valijson's BasicAdapter, given the classes below, as its
 *		own adapters (valijson/adapters/nlohmann_json_adapter.hpp) are.
 *
 * The adapter answers as the nlohmann adapter answers for the text jsonb
 * prints (what the module checked before): a number is an integer when its
 * text has no decimal point and fits in 64 bits, signed when negative and
 * unsigned otherwise, else a double as strtod reads it. The order of an
 * object's members is jsonb's (by length, then bytes), which decides
 * nothing but which of several errors comes first; src/payload_schema.c
 * builds an error's DETAIL through the nlohmann adapter.
 */
#ifndef TIDE_JSONSCHEMA_JSONB_ADAPTER_HPP
#define TIDE_JSONSCHEMA_JSONB_ADAPTER_HPP

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include <valijson/internal/adapter.hpp>
#include <valijson/internal/basic_adapter.hpp>
#include <valijson/internal/frozen_value.hpp>
#include <valijson/exceptions.hpp>

#include "jsonb_reader.h"

namespace tide_jsonschema
{

class JsonbAdapter;
class JsonbArrayValueIterator;
class JsonbObjectMemberIterator;

typedef std::pair<std::string, JsonbAdapter> JsonbObjectMember;

/* An empty array or object: what BasicAdapter makes of "[]" and "{}" alike. */
static inline TideJsonbItem
empty_item(TideJsonbKind kind)
{
	TideJsonbItem item = {kind, nullptr, 0};

	return item;
}

/* A jsonb array or object, for iterating over its elements or members. */
template <class Iterator, TideJsonbKind Kind>
class JsonbContainerView
{
public:
	typedef Iterator const_iterator;
	typedef Iterator iterator;

	JsonbContainerView() : m_item(empty_item(Kind)) {}

	explicit JsonbContainerView(const TideJsonbItem &item) : m_item(item)
	{
		if (item.kind != Kind)
			valijson::throwRuntimeError(Kind == TIDE_JSONB_ARRAY ? "Value is not an array." :
										"Value is not an object.");
	}

	Iterator begin() const { return Iterator(m_item, 0); }
	Iterator end() const { return Iterator(m_item, m_item.size); }

	/* The number of elements or members. */
	size_t size() const { return m_item.size; }

protected:
	TideJsonbItem m_item;
};

/* A jsonb array. */
class JsonbArray : public JsonbContainerView<JsonbArrayValueIterator, TIDE_JSONB_ARRAY>
{
public:
	using JsonbContainerView::JsonbContainerView;
};

/* A jsonb object, whose members can also be found by name. */
class JsonbObject : public JsonbContainerView<JsonbObjectMemberIterator, TIDE_JSONB_OBJECT>
{
public:
	using JsonbContainerView::JsonbContainerView;

	JsonbObjectMemberIterator find(const std::string &propertyName) const;
};

/* A jsonb value as BasicAdapter asks for it. */
class JsonbValue
{
public:
	JsonbValue() : m_item(empty_item(TIDE_JSONB_OBJECT)) {}

	explicit JsonbValue(const TideJsonbItem &item) : m_item(item)
	{
		if (item.kind == TIDE_JSONB_NUMBER)
			read_number();
	}

	/* Only a schema's values are frozen (const, enum), and schemas are nlohmann's. */
	valijson::adapters::FrozenValue *freeze() const
	{
		valijson::throwRuntimeError("A jsonb value cannot be frozen.");
	}

	std::optional<JsonbArray> getArrayOptional() const
	{
		if (m_item.kind == TIDE_JSONB_ARRAY)
			return std::make_optional(JsonbArray(m_item));
		return {};
	}

	bool getArraySize(size_t &result) const
	{
		if (m_item.kind != TIDE_JSONB_ARRAY)
			return false;
		result = m_item.size;
		return true;
	}

	bool getBool(bool &result) const
	{
		if (!isBool())
			return false;
		result = m_item.kind == TIDE_JSONB_TRUE;
		return true;
	}

	bool getDouble(double &result) const
	{
		if (!isDouble())
			return false;
		result = m_double;
		return true;
	}

	bool getInteger(int64_t &result) const
	{
		if (!isInteger())
			return false;
		result = m_number == SIGNED ? m_signed : static_cast<int64_t>(m_unsigned);
		return true;
	}

	std::optional<JsonbObject> getObjectOptional() const
	{
		if (m_item.kind == TIDE_JSONB_OBJECT)
			return std::make_optional(JsonbObject(m_item));
		return {};
	}

	bool getObjectSize(size_t &result) const
	{
		if (m_item.kind != TIDE_JSONB_OBJECT)
			return false;
		result = m_item.size;
		return true;
	}

	bool getString(std::string &result) const
	{
		if (m_item.kind != TIDE_JSONB_STRING)
			return false;
		result.assign(m_item.data, m_item.size);
		return true;
	}

	static bool hasStrictTypes() { return true; }
	bool isArray() const { return m_item.kind == TIDE_JSONB_ARRAY; }
	bool isBool() const { return m_item.kind == TIDE_JSONB_TRUE || m_item.kind == TIDE_JSONB_FALSE; }
	bool isDouble() const { return m_item.kind == TIDE_JSONB_NUMBER && m_number == FLOAT; }
	bool isInteger() const { return m_item.kind == TIDE_JSONB_NUMBER && m_number != FLOAT; }
	bool isNull() const { return m_item.kind == TIDE_JSONB_NULL; }
	bool isNumber() const { return m_item.kind == TIDE_JSONB_NUMBER; }
	bool isObject() const { return m_item.kind == TIDE_JSONB_OBJECT; }
	bool isString() const { return m_item.kind == TIDE_JSONB_STRING; }

private:
	enum NumberKind
	{
		SIGNED, UNSIGNED, FLOAT
	};

	/* Reads a number from its text as nlohmann's lexer reads it (see the top). */
	void read_number()
	{
		char		small[64];
		std::string large;
		const char *text = small;
		size_t		length = TideJsonbNumberText(&m_item, small, sizeof(small));

		if (length >= sizeof(small))
		{
			large.resize(length + 1);
			TideJsonbNumberText(&m_item, &large[0], large.size());
			text = large.c_str();
		}
		m_number = FLOAT;
		if (std::strchr(text, '.') == nullptr)
		{
			errno = 0;
			if (text[0] == '-')
			{
				long long	value = std::strtoll(text, nullptr, 10);

				if (errno == 0)
				{
					m_number = SIGNED;
					m_signed = value;
				}
			}
			else
			{
				unsigned long long value = std::strtoull(text, nullptr, 10);

				if (errno == 0)
				{
					m_number = UNSIGNED;
					m_unsigned = value;
				}
			}
		}
		if (m_number == FLOAT)
			m_double = std::strtod(text, nullptr);
	}

	TideJsonbItem m_item;
	NumberKind	m_number = FLOAT;
	int64_t		m_signed = 0;
	uint64_t	m_unsigned = 0;
	double		m_double = 0;
};

/* The adapter: BasicAdapter over the classes above. */
class JsonbAdapter :
	public valijson::adapters::BasicAdapter<JsonbAdapter, JsonbArray, JsonbObjectMember,
											JsonbObject, JsonbValue>
{
public:
	JsonbAdapter() : BasicAdapter() {}
	explicit JsonbAdapter(const TideJsonbItem &item) : BasicAdapter(JsonbValue(item)) {}
};

/* What both iterators share: a place in a container, by index, and what it points to. */
template <class Derived, class Value>
class JsonbIndexIterator
{
public:
	using iterator_category = std::bidirectional_iterator_tag;
	using value_type = Value;
	using difference_type = Value;
	using pointer = Value *;
	using reference = Value &;

	valijson::adapters::DerefProxy<Value> operator->() const
	{
		return valijson::adapters::DerefProxy<Value>(*static_cast<const Derived &>(*this));
	}

	JsonbIndexIterator(const TideJsonbItem &container, size_t index) : m_container(container), m_index(index) {}

	bool operator==(const Derived &other) const
	{
		const JsonbIndexIterator &that = other;

		return m_container.data == that.m_container.data && m_index == that.m_index;
	}

	bool operator!=(const Derived &other) const { return !(*this == other); }

	const Derived &operator++()
	{
		m_index++;
		return static_cast<const Derived &>(*this);
	}

	Derived operator++(int)
	{
		Derived		before(static_cast<const Derived &>(*this));

		m_index++;
		return before;
	}

	const Derived &operator--()
	{
		m_index--;
		return static_cast<const Derived &>(*this);
	}

protected:
	TideJsonbItem m_container;
	size_t		m_index;
};

/* An iterator over an array's elements. */
class JsonbArrayValueIterator : public JsonbIndexIterator<JsonbArrayValueIterator, JsonbAdapter>
{
public:
	JsonbArrayValueIterator(const TideJsonbItem &array, size_t index) : JsonbIndexIterator(array, index) {}

	JsonbAdapter operator*() const
	{
		TideJsonbItem element;

		TideJsonbElement(&m_container, m_index, &element);
		return JsonbAdapter(element);
	}

	void advance(std::ptrdiff_t n) { m_index += n; }
};

/* An iterator over an object's members, in jsonb's order. */
class JsonbObjectMemberIterator : public JsonbIndexIterator<JsonbObjectMemberIterator, JsonbObjectMember>
{
public:
	JsonbObjectMemberIterator(const TideJsonbItem &object, size_t index) : JsonbIndexIterator(object, index) {}

	JsonbObjectMember operator*() const
	{
		TideJsonbItem key;
		TideJsonbItem value;

		TideJsonbMember(&m_container, m_index, &key, &value);
		return JsonbObjectMember(std::string(key.data, key.size), JsonbAdapter(value));
	}
};

inline JsonbObjectMemberIterator
JsonbObject::find(const std::string &propertyName) const
{
	long		index = m_item.size == 0 ? -1 :
		TideJsonbFind(&m_item, propertyName.data(), propertyName.size());

	return JsonbObjectMemberIterator(m_item, index < 0 ? m_item.size : (size_t) index);
}

}								/* namespace tide_jsonschema */

template <>
struct valijson::adapters::AdapterTraits<tide_jsonschema::JsonbAdapter>
{
	typedef TideJsonbItem DocumentType;

	static std::string adapterName() { return "JsonbAdapter"; }
};

#endif							/* TIDE_JSONSCHEMA_JSONB_ADAPTER_HPP */
