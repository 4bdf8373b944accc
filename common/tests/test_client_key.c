/*
 * test_client_key.c: the key failures are counted under: an IPv4 address
 * as it is, every address of an IPv6 /64 the same, another /64 apart, and
 * an IPv4-mapped address as its IPv4 address.
 */
#include <arpa/inet.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "smtp/client_key.h"

static const char *
key_of(const char *address)
{
	static char				key[CLIENT_KEY_SIZE];
	struct sockaddr_storage ss;

	memset(&ss, 0, sizeof(ss));
	if (inet_pton(AF_INET, address, &((struct sockaddr_in *) &ss)->sin_addr) == 1)
		ss.ss_family = AF_INET;
	else
	{
		assert_int_equal(inet_pton(AF_INET6, address, &((struct sockaddr_in6 *) &ss)->sin6_addr), 1);
		ss.ss_family = AF_INET6;
	}
	client_key((struct sockaddr *) &ss, key, sizeof(key));
	return key;
}

static void
ipv4_is_the_address(void **state)
{
	assert_string_equal(key_of("192.0.2.7"), "192.0.2.7");
	assert_string_not_equal(key_of("192.0.2.7"), "192.0.2.8");
}

static void
ipv6_is_the_slash_64(void **state)
{
	char first[CLIENT_KEY_SIZE];

	assert_string_equal(key_of("2001:db8:1:2::1"), "2001:db8:1:2::/64");
	strcpy(first, key_of("2001:db8:1:2::1"));
	assert_string_equal(key_of("2001:db8:1:2:ffff:ffff:ffff:fffe"), first);
	assert_string_not_equal(key_of("2001:db8:1:3::1"), first);
	assert_string_equal(key_of("::1"), "::/64");
}

static void
ipv4_mapped_is_ipv4(void **state)
{
	assert_string_equal(key_of("::ffff:192.0.2.7"), "192.0.2.7");
}

static void
longest_key_fits(void **state)
{
	assert_string_equal(key_of("fedc:ba98:7654:3210:1:2:3:4"), "fedc:ba98:7654:3210::/64");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(ipv4_is_the_address),
		cmocka_unit_test(ipv6_is_the_slash_64),
		cmocka_unit_test(ipv4_mapped_is_ipv4),
		cmocka_unit_test(longest_key_fits),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
