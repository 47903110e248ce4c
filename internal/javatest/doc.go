// Package javatest holds runnel's tests against Apache RocketMQ itself: the
// official Java client (through internal/javapeer's driver) and mqadmin
// against runnel's broker (TestJavaClient…, TestJavaAdmin…), and runnel's
// client and jobs against Apache RocketMQ's Java name server and broker
// (TestJavaBroker…), for the pinned versions 5.3.3 and 4.9.7. They skip,
// saying why, where Java or Maven is missing.
package javatest
